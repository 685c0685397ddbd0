from precompile.cli import main

raise SystemExit(main())
