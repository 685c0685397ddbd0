"""Capture: the public capture API and the tracers (makefx/, dynamo/) that turn a user's calls into
graphs, lower them with a backend (lowering), freeze the kernels they need (kernels) and hand the
result to codegen and the pair writer."""
