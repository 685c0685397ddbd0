"""The token hash by which load passes a recorded function whose text changed only in comments, blank
lines or spacing (drivers/source_checks.py `code_tokens_sha256`): it must tell apart every edit that
could change what the code computes, a docstring's and a string's spelling included, and pass only
the layout of the same tokens."""
from __future__ import annotations

import pytest

from precompile.codegen.drivers.source_checks import _range_unchanged, code_tokens_sha256

METHOD = '''    @torch.no_grad()
    def forward(self, x):
        """Scale."""
        y = self.linear(x) * 2
        return y.sin()
'''


@pytest.mark.parametrize("layout", [
    METHOD.replace("        y = ", "        # the doubled layer\n\n        y = "),
    METHOD.replace("* 2\n", "*2  # doubled\n"),
    METHOD.replace("    ", "  "),  # narrower indents, the same nesting
    METHOD.replace("self.linear(x) * 2", "self.linear(\n            x,\n        ) * 2").replace("x,\n", "x\n"),
])
def test_the_same_tokens_laid_out_otherwise_hash_alike(layout):
    assert code_tokens_sha256(layout) == code_tokens_sha256(METHOD) is not None


@pytest.mark.parametrize("edit", [
    METHOD.replace("* 2", "* 3"),
    METHOD.replace('"""Scale."""', '"""Scale twice."""'),
    METHOD.replace('"""Scale."""', "'''Scale.'''"),  # the same value, spelled otherwise: conservative
    METHOD.replace("return y.sin()", "return (y).sin()"),
    METHOD.replace("        return y.sin()", "    return y.sin()"),  # the same tokens, one block out
    METHOD.replace("    @torch.no_grad()\n", ""),
])
def test_any_other_edit_hashes_otherwise(edit):
    assert code_tokens_sha256(edit) != code_tokens_sha256(METHOD)


@pytest.mark.parametrize("partial", ["    x = call(a,\n", "        return y\n    z = 1\n  w = 2\n"])
def test_text_that_does_not_tokenize_alone_has_no_token_hash(partial):
    assert code_tokens_sha256(partial) is None


def test_an_unnamed_range_passes_the_same_tokens():
    lines = ["import torch\n", "ACT = lambda y: y * 2\n", "OTHER = 1\n"]
    source = {"first_line": 2, "last_line": 3, "sha256": "0" * 64, "token_sha256": code_tokens_sha256(lines[1])}
    assert _range_unchanged(["import torch\n", "ACT = lambda y: y*2  # doubled\n", "OTHER = 1\n"], source, {})
    assert not _range_unchanged(["import torch\n", "ACT = lambda y: y * 3\n", "OTHER = 1\n"], source, {})
    assert not _range_unchanged(lines, {**source, "token_sha256": ""}, {})  # written before token hashes
