"""Host fit is judged by instruction set only (issue 38, finding 7): a VM's or a microcode's
cpuinfo flags never block serving, a missing instruction-set extension still does, and caches that
recorded every flag are compared on the instruction-set flags among them."""
from __future__ import annotations

from precompile.artifact import bundle_keys

VM = "fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 f16c avx512f avx512bw avx512_vnni hypervisor tsc_known_freq constant_tsc"
BARE_METAL = "fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 f16c avx512f avx512bw avx512_vnni constant_tsc nonstop_tsc ibrs"


def _keys(flags: str) -> dict[str, str]:
    return {"machine": "x86_64", "cpu_flags": flags}


def test_flags_that_are_not_instruction_sets_never_block_serving():
    """An old cache captured in a VM recorded hypervisor and tsc_known_freq: the same CPU on bare
    metal serves it."""
    assert bundle_keys.mismatches(_keys(VM), _keys(BARE_METAL)) == []
    assert bundle_keys.mismatches(_keys(BARE_METAL), _keys(VM)) == []


def test_a_missing_instruction_set_extension_still_blocks_serving():
    (mismatch,) = bundle_keys.mismatches(_keys(VM), _keys(BARE_METAL.replace(" avx512_vnni", "").replace(" fma", "")))
    assert mismatch.key == "cpu_flags" and mismatch.captured == "avx512_vnni fma"
    assert str(mismatch) == "this CPU lacks instruction-set flags of the capturing CPU: avx512_vnni fma"


def test_capture_records_only_instruction_set_flags():
    assert bundle_keys.isa_flags(VM.split()) == frozenset(VM.split()) - {"fpu", "hypervisor", "tsc_known_freq", "constant_tsc"}
    recorded = bundle_keys.host_keys()["cpu_flags"].split()
    assert "hypervisor" not in recorded and "constant_tsc" not in recorded
    assert set(recorded) == bundle_keys.isa_flags(recorded)


def test_another_architecture_keeps_every_feature():
    arm = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics"
    assert bundle_keys.isa_flags(arm.split()) == frozenset(arm.split())
