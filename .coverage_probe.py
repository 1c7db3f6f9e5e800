"""For the installed transformers: declared EP families, covered (declared - NOT_COVERED), and which of the covered
build their tiny checkpoint with a clear router (the routing test's assertions), with the first error line."""
import sys, warnings, json, traceback
warnings.simplefilter("ignore")
sys.path.insert(0, "tests/gpu")
import transformers, torch
import families, ep_coverage, tiny_models, tolerances
from routing import RoutingRecorder
declared = families.declared_ep_families()
covered = ep_coverage.covered_ep_families(declared)
bad = {}
for name in covered:
    try:
        family = families.family(name)
        config = families.config_class(name)(**family.config)
        torch.manual_seed(0)
        model = families.model_class(config)(config)
        with torch.no_grad():
            tiny_models.write_routing_code(model, family)
            tiny_models.calibrate_router_gain(model, family)
            recorder = RoutingRecorder(model, family)
            model(tiny_models.make_batch(), use_cache=False)
        margin = min(layer.margin for layer in recorder.layers)
        if margin < tolerances.ROUTING_MARGIN_MIN:
            bad[name] = f"margin {margin:.3f}"
    except Exception as error:
        bad[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
print(json.dumps({"transformers": transformers.__version__, "declared": len(declared), "covered": len(covered),
                  "not_covered": ep_coverage.not_covered_ep_families(declared), "covered_but_broken": bad}, indent=1))
