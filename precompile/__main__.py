from precompile.cli.main import main

raise SystemExit(main())
