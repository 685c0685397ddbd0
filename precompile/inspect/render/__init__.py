"""What the reports look like to a person: terminal text (`render_text`), diff as Markdown
(`render_markdown`) and JUnit XML (`junit`), the HTML report (`html_report`, `highlight`, `templates/`),
every artifact-supplied string made safe to show through one helper (`terminal_text`).

Imports from inspect: `model`, `formats`, `reading`, `diff`; it renders, it never reads an artifact
itself. Beside it: the artifact room and precompile.errors.
"""
