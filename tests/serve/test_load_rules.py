"""load(): which problems of a pair are fatal, which degrade with a warning, and the served checks."""
from __future__ import annotations

import hashlib
import warnings

import msgspec
import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError, PrecompileWarning
from precompile.artifact import codec
from precompile.artifact.pair import parse_cache


def forward(model, x, scale):
    return model(x) * scale


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pair")
    with precompile.capture(  # grad enabled, as the tests serve it
        forward, artifact_path=directory / "m.py", cache_path=directory / "m.cache",
        tracer=precompile.MakeFxTracer(), backend="eager",
    ) as cap:
        cap(nn.Linear(4, 3), torch.ones(2, 4), 0.5)
    return directory / "m.py", directory / "m.cache"


def copy_pair(pair, tmp_path):
    artifact, cache = tmp_path / "m.py", tmp_path / "m.cache"
    artifact.write_bytes(pair[0].read_bytes())
    cache.write_bytes(pair[1].read_bytes())
    return artifact, cache


def rewrite_envelope(cache, **changes):
    parsed = parse_cache(cache, cache.read_bytes())
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(parsed.envelope, **changes)))


def test_missing_files_and_non_artifacts_are_refused(pair, tmp_path):
    with pytest.raises(PrecompileError, match=r"python_code .*nope.py does not exist"):
        precompile.load(tmp_path / "nope.py", pair[1])
    (tmp_path / "x.py").write_text("print('hello')\n")
    with pytest.raises(PrecompileError, match="x.py is not a precompile artifact"):
        precompile.load(tmp_path / "x.py", pair[1])
    with pytest.raises(PrecompileError, match="is not UTF-8 text .*were the artifact and cache paths swapped"):
        precompile.load(pair[1], pair[0])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend": "inductor"}, r"the cache's backend 'inductor' does not match the python_code BACKEND 'eager'"),
        ({"tracer": "dynamo"}, r"the cache's tracer 'dynamo' does not match the python_code TRACER 'make_fx'"),
        ({"code_hash": "0" * 64}, r"the cache's code_hash 0{64} does not match sha256\(python_code\) [0-9a-f]{64}"),
    ],
)
def test_a_cache_from_another_capture_is_fatal(pair, tmp_path, changes, message):
    artifact, cache = copy_pair(pair, tmp_path)
    rewrite_envelope(cache, **changes)
    with pytest.raises(PrecompileError, match="came from different captures: " + message):
        precompile.load(artifact, cache)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:7], "not a precompile cache file"),
        (lambda data: b"garbage" * 10, "not a precompile cache file"),
        (lambda data: data[: codec.PREFIX_SIZE + 4], "is truncated"),
        (None, r"cache .* does not exist"),
    ],
)
def test_an_unusable_cache_is_ignored_with_a_warning(pair, tmp_path, damage, message):
    artifact, cache = copy_pair(pair, tmp_path)
    if damage is None:
        cache.unlink()
    else:
        cache.write_bytes(damage(cache.read_bytes()))
    with pytest.warns(PrecompileWarning, match="ignoring the cache: .*" + message):
        runnable = precompile.load(artifact, cache)
    assert not runnable.cache_used
    assert runnable(nn.Linear(4, 3), torch.ones(2, 4), 0.5).shape == (2, 3)


def with_lines_appended(pair, tmp_path, text):
    """A copy of the pair with `text` appended to python_code and the cache's code_hash following it."""
    artifact, cache = copy_pair(pair, tmp_path)
    artifact.write_text(artifact.read_text() + text)
    rewrite_envelope(cache, code_hash=hashlib.sha256(artifact.read_bytes()).hexdigest())
    return artifact, cache


def test_load_reads_the_metadata_of_the_code_it_runs_the_last_assignment_winning(pair, tmp_path):
    artifact, cache = with_lines_appended(pair, tmp_path, "BACKEND = 'inductor'\n")
    with pytest.raises(PrecompileError, match="the cache's backend 'eager' does not match the python_code BACKEND 'inductor'"):
        precompile.load(artifact, cache)


def test_code_that_parses_but_does_not_compile_is_refused_after_the_metadata_and_pairing_checks(pair, tmp_path):
    """python_code is parsed once, for its metadata, and that tree compiled: an error only the compiler
    finds is reported as before, and only once the metadata and the pairing passed."""
    artifact, cache = with_lines_appended(pair, tmp_path, "return 1\n")
    with pytest.raises(PrecompileError, match=r"m.py failed to execute: SyntaxError: 'return' outside function \(m.py, line \d+\)"):
        precompile.load(artifact, cache)
    artifact, cache = with_lines_appended(pair, tmp_path, "return 1\nBACKEND = 'inductor'\n")
    with pytest.raises(PrecompileError, match="does not match the python_code BACKEND 'inductor'"):
        precompile.load(artifact, cache)


def test_an_interrupted_write_is_finished_by_load(pair, tmp_path):
    """Killed between the two renames: new python_code, old cache, and the new cache pending."""
    artifact, cache = copy_pair(pair, tmp_path)
    new_cache = cache.read_bytes()
    rewrite_envelope(cache, code_hash="f" * 64)  # the previous capture's cache
    (tmp_path / "m.cache.pending").write_bytes(new_cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecompileWarning)
        runnable = precompile.load(artifact, cache)
    assert runnable.cache_used
    assert cache.read_bytes() == new_cache and not (tmp_path / "m.cache.pending").exists()


def test_serve_time_compiles_are_refused_for_an_artifact_with_no_compiler_behind_it(pair):
    artifact, cache = pair
    with pytest.raises(PrecompileError, match=r"is a standalone artifact, which has no compiler behind it"):
        precompile.load(artifact, cache, allow_serve_time_compiles=True)
    assert precompile.load(artifact, cache, allow_serve_time_compiles=False) is not None


def test_runnable_is_a_no_op_context_manager(pair):
    runnable = precompile.load(*pair)
    assert isinstance(runnable, precompile.PrecompiledRunnable) and runnable.installed is False
    with runnable as entered:
        assert entered is runnable
    runnable.unload()
    assert runnable(nn.Linear(4, 3), torch.ones(2, 4), 0.5).shape == (2, 3)


MODEL = nn.Linear(4, 3)


class Renamed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((MODEL, torch.ones(2, 4)), "expected 3 positional arguments, got 2"),
        ((torch.ones(2, 4), torch.ones(2, 4), 0.5), "argument 0 must be an nn.Module .* got Tensor"),
        ((MODEL, [torch.ones(2, 4)], 0.5), "the inputs have structure .* but the artifact was captured with"),
        ((MODEL, torch.ones(5, 4), 0.5), r"input args\[1\]: expected shape \(2, 4\), got \(5, 4\)"),
        ((MODEL, torch.ones(2, 4, dtype=torch.float64), 0.5), r"input args\[1\]: expected dtype torch.float32, got torch.float64"),
        ((MODEL, torch.ones(2, 4, device="meta"), 0.5), r"input args\[1\]: expected device cpu, got meta"),
        ((MODEL, torch.ones(2, 4), 2.0), r"input args\[2\] is 2.0 but the artifact was captured with 0.5"),
        ((nn.Linear(4, 5), torch.ones(2, 4), 0.5), r"model tensor weight: expected shape \(3, 4\), got \(5, 4\)"),
        ((Renamed(), torch.ones(2, 4), 0.5), r"missing \['weight', 'bias'\], unexpected \['lin.weight', 'lin.bias'\]"),
    ],
)
def test_served_calls_check_the_calling_convention(pair, args, message):
    runnable = precompile.load(*pair)
    with pytest.raises(PrecompileError, match=message) as info:
        runnable(*args)
    assert str(pair[0].name) in str(info.value)


def test_a_keyword_the_capture_did_not_pass_is_refused_at_serve_time(pair):
    with pytest.raises(PrecompileError, match=r"got keyword arguments \['scale'\] but the artifact was captured with \[\] "
                                              r"\(missing \[\], unexpected \['scale'\]\)"):
        precompile.load(*pair)(MODEL, torch.ones(2, 4), scale=0.5)


def test_the_fast_path_notices_every_change_to_the_model_between_calls(pair):
    """After a validated call the driver re-fetches tensors by a cached plan and checks them in C++;
    any change to the model must still be served correctly or refused with the precise message."""
    runnable = precompile.load(*pair)
    model, x = nn.Linear(4, 3), torch.ones(2, 4)
    with torch.enable_grad():  # the grad mode the pair was captured in
        assert torch.allclose(runnable(model, x, 0.5), forward(model, x, 0.5))
        model.weight = nn.Parameter(torch.full((3, 4), 2.0))  # a new tensor, same structure: served
        assert torch.allclose(runnable(model, x, 0.5), forward(model, x, 0.5))
        model.bias.requires_grad_(False)  # a metadata change the C++ check sees: re-validated, served
        assert torch.allclose(runnable(model, x, 0.5), forward(model, x, 0.5))
        model.weight.data = model.weight.data.double()
        with pytest.raises(PrecompileError, match="model tensor weight: expected dtype torch.float32, got torch.float64"):
            runnable(model, x, 0.5)
        model.weight.data = torch.ones(3, 4)
        model.register_buffer("extra", torch.zeros(1))
        with pytest.raises(PrecompileError, match=r"unexpected \['extra'\]"):
            runnable(model, x, 0.5)
        del model.extra
        assert torch.allclose(runnable(model, x, 0.5), forward(model, x, 0.5))
        with pytest.raises(PrecompileError, match=r"input args\[1\]: expected shape \(2, 4\), got \(3, 4\)"):
            runnable(model, torch.ones(3, 4), 0.5)


def encode_decode(encoder, decoder, x):
    return decoder(encoder(x))


def test_the_fast_path_notices_a_replaced_submodule_and_a_broken_tie(tmp_path):
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = nn.Linear(4, 4), nn.Linear(4, 4)
            self.decoder.weight = self.encoder.weight

        def forward(self, x):
            return self.decoder(self.encoder(x))

    model, x = Pair(), torch.ones(2, 4)
    with torch.no_grad(), precompile.capture(
        mlp_call, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
        tracer=precompile.MakeFxTracer(), backend="eager",
    ) as cap:
        cap(model, x)
    runnable = precompile.load(tmp_path / "m.py", tmp_path / "m.cache")
    with torch.no_grad():
        assert torch.allclose(runnable(model, x), model(x))
        model.encoder = nn.Linear(4, 4)  # a new submodule: the tie to decoder.weight is gone
        with pytest.raises(PrecompileError, match=r"unexpected \['decoder.weight'\]"):
            runnable(model, x)
        model.decoder.weight = model.encoder.weight
        assert torch.allclose(runnable(model, x), model(x))
        model.decoder.weight = nn.Parameter(model.encoder.weight.detach().clone())  # untied in place
        with pytest.raises(PrecompileError, match=r"unexpected \['decoder.weight'\]"):
            runnable(model, x)


def mlp_call(model, x):
    return model(x)
