# The dispatch state a DynamoTracer artifact's guards are built under (precompile/codegen/drivers/
# dispatch_state.py, included verbatim). torch's tensor guards compare each tensor's dispatch keys as
# the thread-local include/exclude sets adjust them (inference_mode drops autograd's keys, autocast
# keeps its own), and Dynamo builds them under the sets of the call it compiled: the artifact builds
# them under those sets again, whatever mode the process that loads it is in.
import threading

import torch

_dispatch_sets: dict = {}


def dispatch_key_sets(modes):
    """torch's thread-local dispatch key sets (include, exclude) in a fresh thread that switched on
    `modes`: "inference_mode", "autocast:<device type>" (what the capture saw its call run under)."""
    if modes not in _dispatch_sets:
        found = []

        def read():
            with torch.inference_mode("inference_mode" in modes):
                for mode in modes:
                    if mode.startswith("autocast:"):
                        torch.set_autocast_enabled(mode.removeprefix("autocast:"), True)
                found.append((torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()))

        thread = threading.Thread(target=read, name="precompile-dispatch-keys")
        thread.start()
        thread.join()
        _dispatch_sets[modes] = found[0]
    return _dispatch_sets[modes]


def captured_under(modes):
    """What a miss on a tensor's dispatch keys adds to its reason: the modes the variant's call ran under."""
    where = f"under {', '.join(modes)}" if modes else "outside inference_mode and autocast"
    return (f"(captured {where}; a tensor's keys change with inference_mode, autocast, an inference tensor "
            "or a torch.func transform)")
