"""Codegen: typed render models -> Jinja2 templates -> python_code text, deterministically."""
