"""Built-in examples: the demo model `precompile demo` captures."""
