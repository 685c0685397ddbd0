"""The torch side: capture (tracers, lowering), the atomic pair writer, and load."""
