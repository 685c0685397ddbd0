"""The MakeFx tracer: one traced graph per call signature (trace), rendered and frozen (build)."""
