from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import property_budget  # noqa: F401  (loads the hypothesis profile before any test module makes its settings)
import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent


# What the compat run (`./dev compat VERSION`, CI on torch 2.11, 2.12, 2.14.1 and 2.15.0) covers, by file:
# every fresh-process round trip, the demo, Dynamo, inspect, the torch_compat door and the goldens each
# torch version keeps. The rest (capture API details, refusals, fuzzing) exercises our own code the
# same way on every torch.
COMPAT_FILES = {
    "test_cli_demo.py", "test_codegen_snapshots.py", "test_deterministic_capture.py", "test_doctor.py",
    "test_dynamo.py", "test_dynamo_guards.py", "test_dynamo_lowering.py", "test_inductor.py", "test_inspect_cli.py",
    "test_inspect_safety.py", "test_no_compilation.py", "test_plain_exec.py", "test_roundtrip.py",
    "test_runtime_wrappers.py", "test_torch_compat.py",
}


# What `./dev quick` (-m "not slow") leaves out: every test that took over ~2 s in a full run on a
# loaded 2-core box (Inductor compiles, fresh-process round trips, ranks, fuzz, the zoo, the browser),
# and every test that shares a fixture that costs that much once (captured_inductor, Dynamo's
# dynamo_pairs and lowered, the relocation venv, the zoo's pairs, doctor's report, the ranks'
# captured), since the first such test left in would pay for it; likewise what was fast only because
# an earlier test had already warmed Inductor up in this process (a run of the selection showed them).
# By file basename, or by "file::test" (every case of it) or
# "file::test[case]" (that case alone).
SLOW_FILES = {
    "test_alias_identity.py",
    "test_unbacked_reads.py",
    "test_capture_cotenant.py::test_a_capture_never_compiles_a_header_a_co_tenant_planted_in_the_default_root",
    "test_dynamo_call_built_state.py",
    "test_dynamo_rnn.py",
    "test_dynamic_shapes.py",
    "test_changed_after_capture.py",
    "test_makefx_autograd.py",
    "test_trace_failures.py",
    "test_doctor.py",
    "test_dynamo_lowering.py",
    "test_diff_ci_kernels.py",
    "test_html_report_browser.py",
    "test_inductor.py",
    "test_inspect_determinism.py",
    "test_layouts_and_keywords.py",
    "test_plain_exec.py",
    "test_pytest_plugin.py",
    "test_roundtrip.py",
    "test_runtime_wrappers.py",
    "test_zoo.py",
}
SLOW_TESTS = {
    "test_installed.py::test_a_global_dynamo_bound_by_id_is_seeded_by_name_so_a_fresh_process_serves_installed",
    "test_child_python.py::test_demo_serves_in_an_empty_dir_without_importing_from_the_cwd",
    "test_child_python.py::test_doctor_probe_does_not_import_from_the_cwd",
    "test_cli_demo.py::test_demo_captures_reloads_in_a_fresh_process_and_matches_eager",
    "test_deterministic_capture.py::test_captures_under_two_tmpdirs_diff_equal_in_their_kernels",
    "test_kernel_dir.py::test_two_captures_in_two_processes_take_turns_the_second_saying_it_waits_and_for_whom",
    "test_jit_root.py::test_python_code_alone_compiles_into_a_private_root_and_never_maps_the_co_tenants_libraries",
    "test_constants.py::test_a_large_constant_is_refused_before_lowering[dynamo-inductor-adds_a_big_constant]",
    "test_constants.py::test_a_large_constant_is_refused_before_lowering[makefx-inductor-reads_a_big_global]",
    "test_constants.py::test_inductor_renders_the_constants_its_output_module_keeps",
    "test_constants.py::test_small_and_zero_size_constants_are_served_fresh_under_no_compilation",
    "test_distributed.py::test_a_collective_makefx_cannot_trace_is_refused_on_every_rank_naming_the_op",
    "test_distributed.py::test_load_everywhere_from_another_source_rank",
    "test_distributed.py::test_load_everywhere_needs_a_process_group",
    "test_distributed.py::test_load_refuses_another_world_naming_both",
    "test_distributed.py::test_load_everywhere_serves_every_rank_from_the_source_rank_files",
    "test_distributed.py::test_python_code_runs_as_plain_python_on_every_rank",
    "test_distributed.py::test_spmd_capture_runs_on_every_rank_and_the_writer_alone_writes",
    "test_distributed.py::test_the_artifact_records_its_world_and_show_prints_it",
    "test_distributed.py::test_the_documented_torchrun_recipe_captures_and_serves_on_two_ranks",
    "test_dynamo.py::test_a_continuation_that_compiled_nothing_runs_as_plain_python",
    "test_dynamo.py::test_a_graph_breaking_artifact_serves_beside_a_live_compile_and_never_clobbers_a_bound_name",
    "test_dynamo.py::test_a_live_compile_after_loading_never_mints_a_name_the_artifact_holds",
    "test_dynamo.py::test_a_training_step_serves_its_backward_and_accumulates_grads_like_eager",
    "test_dynamo.py::test_an_inductor_dynamo_artifact_serves_without_its_cache_from_python_code_alone",
    "test_dynamo.py::test_an_inlined_source_that_changed_since_capture_is_refused_at_load",
    "test_dynamo.py::test_dropped_slots_carry_their_rendered_check_without_process_ids",
    "test_dynamo.py::test_dynamic_true_serves_other_sizes_from_one_variant",
    "test_dynamo.py::test_extract_writes_each_inductor_output_module_as_its_own_file",
    "test_dynamo.py::test_fresh_process_serves_every_variant_and_misses_clearly",
    "test_dynamo.py::test_guard_slots_are_accounted_per_variant_and_the_policy_drops_what_every_variant_held",
    "test_dynamo.py::test_precompile_guards_lists_what_each_variant_does_not_check",
    "test_dynamo.py::test_python_code_states_what_was_captured_readably",
    "test_dynamo.py::test_readable_parts_of_a_dynamo_artifact_are_locked",
    "test_dynamo.py::test_risky_drops_are_gated_and_diff_shows_them_first",
    "test_dynamo.py::test_summaries_of_real_captures",
    "test_dynamo.py::test_two_dynamo_captures_may_not_overlap",
    "test_dynamo.py::test_what_serves_is_the_subgraph_source_python_code_shows",
    "test_dynamo_guards.py::test_a_standalone_eager_artifact_serves_without_importing_dynamo_inductor_or_aot_autograd",
    "test_dynamo_guards.py::test_every_capture_here_renders_every_guard_and_pickles_nothing",
    "test_dynamo_guards.py::test_a_global_dict_subclass_whose_setitem_refiles_keys_is_guarded_by_its_live_keys",
    "test_format_versions.py::test_show_verify_and_diff_read_every_layout_ever_written[v1-dynamo_lowered]",
    "test_html_report.py::test_report_is_torch_free",
    "test_html_report.py::test_the_page_is_deterministic",
    "test_inspect_bounds.py::test_a_four_megabyte_diff_finishes_and_shows_a_bounded_part",
    "test_inspect_cli.py::test_diff_masks_the_prefix_each_artifact_gives_its_names",
    "test_inspect_cli.py::test_guards_filters_name_what_they_accept_and_show_what_tensor_guards_check",
    "test_inspect_cli.py::test_verb_json[guards-v1/dynamo_lowered]",
    "test_inspect_fuzz.py::test_fuzz",
    "test_inspect_fuzz.py::test_no_verb_runs_hostile_python_code",
    "test_inspect_safety.py::test_no_verb_imports_torch",
    "test_installed.py::test_a_child_module_graph_break_captures_an_installed_artifact_that_lists_its_frames",
    "test_installed.py::test_a_frame_an_installed_artifact_cannot_find_by_name_is_refused_at_write_time",
    "test_installed.py::test_a_transformers_model_with_a_graph_break_in_a_layer_serves_installed",
    "test_installed.py::test_allow_serve_time_compiles_compiles_a_miss_serves_captured_variants_first_and_honours_the_limit",
    "test_installed.py::test_installed_artifacts_serve_in_a_fresh_process_with_the_stance_rules",
    "test_installed.py::test_installed_load_refuses_a_frame_whose_source_changed_since_capture",
    "test_installed.py::test_installed_load_refuses_compiled_autograd_live_entries_and_disabled_dynamo",
    "test_load_bytecode.py::test_a_process_at_another_optimization_level_compiles_python_code",
    "test_load_bytecode.py::test_inductor_output_modules_a_dynamo_artifact_carries_as_text_are_not_compiled_at_load",
    "test_load_fuzz.py::test_mutated_caches_are_served_degraded_or_refused",
    "test_no_compilation.py::test_the_variable_set_to_exactly_1_at_startup_turns_the_policy_on",
    "test_progress.py::test_doctor_says_what_it_is_probing_when_piped",
    "test_progress.py::test_on_a_terminal_a_capture_shows_a_live_line_with_the_elapsed_time_by_default",
    "test_progress.py::test_verbose_shows_plain_lines_when_piped_and_nothing_otherwise",
    "test_readme.py::test_the_quickstart_runs_as_written_and_leaves_a_pair_that_verifies",
    "test_relocation.py::test_a_different_torch_build_is_still_refused_with_a_warning_naming_both_values",
    "test_relocation.py::test_a_second_venv_with_the_same_torch_build_serves_both_tracers_with_no_compile",
    "test_relocation.py::test_the_same_capture_in_another_venv_of_one_torch_build_diffs_equal",
    "test_relocation.py::test_torch_free_host_keys_agree_with_the_imported_torch",
    "test_identity.py::test_load_in_a_fresh_process_refuses_rollback_and_substitution",
    "test_signing.py::test_load_everywhere_ships_the_signature_so_every_rank_checks_it",
    "test_signing.py::test_load_refuses_pairs_its_trusted_keys_did_not_sign_before_executing_them",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in COMPAT_FILES:
            item.add_marker(pytest.mark.compat)
        if (item.path.name in SLOW_FILES or f"{item.path.name}::{item.originalname}" in SLOW_TESTS
                or f"{item.path.name}::{item.name}" in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


def dynamo_modules_read(artifact: Path) -> list[str]:
    """The torch._dynamo modules a standalone Dynamo artifact's transformed code reads as globals
    (torch 2.11's Dynamo inlines its own polyfills there), so serving it imports Dynamo; not those
    the driver stands in for."""
    import ast

    tree = ast.parse(artifact.read_text(encoding="utf-8"))
    frames = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", None) == "_dynamo_frames")
    return sorted({module for frame in frames for alias, module in frame["import_sources"].items()
                   if (module == "torch._dynamo" or module.startswith("torch._dynamo."))
                   and alias not in frame["stand_ins"]})  # torch._dynamo.utils: the driver's stand-in


def run_fresh(code: str, *args: str, timeout: float = 300, env: dict | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with tests/ importable (and `env` added to the environment)."""
    # Ahead of any PYTHONPATH already set (bench/gpu_check.sh puts the carried wheels there).
    path = [str(TESTS), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=cwd)
    return proc


def fresh_json(code: str, *args: str, env: dict | None = None):
    proc = run_fresh(code, *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def capture_cases(directory: Path, backend: str) -> dict[str, tuple[Path, Path]]:
    import torch

    import precompile
    from cases import CASES

    pairs = {}
    for name, case in CASES.items():
        artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
        with torch.set_grad_enabled(case.grad), precompile.capture(
            case.fn, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer(), backend=backend
        ) as cap:
            cap(*case.args())
        pairs[name] = (artifact, cache)
    return pairs


@pytest.fixture(scope="session")
def captured(tmp_path_factory):
    """Every case of tests/cases.py captured once per session (MakeFx, eager backend)."""
    return capture_cases(tmp_path_factory.mktemp("captured"), "eager")


@pytest.fixture(scope="session")
def captured_inductor(tmp_path_factory):
    """Every case of tests/cases.py captured once per session with the inductor backend (slow: ~15 s each)."""
    return capture_cases(tmp_path_factory.mktemp("captured-inductor"), "inductor")


CO_TENANT = 65534
"""The second user the co-tenant tests emulate (nobody), by a forked child that drops to it."""


def as_co_tenant(action, what: str) -> None:
    """Run `action` in a forked child that dropped to the co-tenant's uid and gid (umask 0, as a
    careless or hostile user runs); skip where this process cannot (not root). `what`: what the
    action does, for the failure."""
    import os

    if os.getuid() != 0:
        pytest.skip("emulating a second user needs root here (to drop a forked child to uid 65534)")
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups([])
            os.setgid(CO_TENANT)
            os.setuid(CO_TENANT)
            os.umask(0)
            action()
            status = 0
        except BaseException as exc:  # said on stderr, which pytest shows with the failure
            os.write(2, f"co-tenant: {type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the co-tenant could not {what}"
