"""The `precompile` command: argument parsing and exit codes (main), the built-in demo and doctor."""
