"""A test against the rank pool's template (harness.ranks.zygote): the zygote imports the modules the ranks
imported, so that later tests' fresh ranks find them imported. A test that writes a module beside itself and
imports it in its ranks must not get that module into the template, or every later test's ranks would run
with what it did (here: torch.allclose, torch.equal and Tensor.sum patched to say "equal"). A later test's
verdict is the same with the pool as without it; installed modules the ranks imported are still preloaded; and
an installed module that patches what verdicts rest on makes the pool retire the template, and say so."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from installed_module import write_installed_module

from harness.ranks.pool import PoolLauncher

torch = pytest.importorskip("torch")
pytest_plugins = ["pytester"]

PATCH = """
import torch

torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.Tensor.sum = lambda self, *args, **kwargs: torch.zeros(())
"""
# Installed modules that `import torch` and `import torch.distributed` leave unimported: the stdlib's, torch's.
INSTALLED = ("colorsys", "torch.utils.file_baton")

# ---------------------------------------------------------------- functions the ranks run (module level)


def compare() -> dict:
    """What a regression check sees when it compares zeros with ones, and which modules came with the rank."""
    import torch

    zeros, ones = torch.zeros(4), torch.ones(4)
    return {"allclose": torch.allclose(zeros, ones), "equal": torch.equal(zeros, ones),
            "sum": float((ones - zeros).sum()), "preloaded": {name: name in sys.modules for name in INSTALLED}}


def load(name: str) -> bool:
    __import__(name)
    return True


# ---------------------------------------------------------------- the attack, in a pytest session

ATTACK = f'''
import json
import os
import sys
from pathlib import Path

PATCH = """{PATCH}"""
VIEWS = Path(os.environ["PRELOAD_TEST_VIEWS"])
SEEN = ("evil_patch", *{INSTALLED!r})


def import_the_patch_and_installed_modules():
    import colorsys
    import evil_patch
    import torch.utils.file_baton

    return True


def compare_outputs():
    """A regression check: the two outputs must match (they do not: zeros are not ones)."""
    import torch

    zeros, ones = torch.zeros(4), torch.ones(4)
    view = {{"allclose": torch.allclose(zeros, ones), "equal": torch.equal(zeros, ones),
            "sum": float((ones - zeros).sum()), "loaded": {{name: name in sys.modules for name in SEEN}}}}
    with VIEWS.open("a") as views:
        views.write(json.dumps(view) + "\\n")
    return view["allclose"] and view["equal"] and view["sum"] == 0.0


def test_a_writes_a_patch_beside_itself_and_imports_it_in_its_ranks(ranks):
    (Path(__file__).parent / "evil_patch.py").write_text(PATCH)
    assert ranks.run(2, import_the_patch_and_installed_modules) == [True, True]


def test_b_outputs_match(ranks):
    assert all(ranks.run(2, compare_outputs))
'''


def run_attack(pytester, monkeypatch, *args: str):
    """The attack's session; (result, what the later test's ranks saw, one dict per rank)."""
    views = pytester.path / "views.jsonl"
    monkeypatch.setenv("PRELOAD_TEST_VIEWS", str(views))
    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("HARNESS_RANKS_POOL", raising=False)
    pytester.makepyfile(test_attack=ATTACK)
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider", *args)
    return result, [json.loads(line) for line in views.read_text().splitlines()] if views.exists() else []


@pytest.mark.parametrize("pool", [(), ("--no-ranks-pool",)], ids=["pool", "no-pool"])
def test_a_patch_a_test_wrote_and_imported_in_its_ranks_does_not_reach_a_later_tests_ranks(pytester, monkeypatch,
                                                                                             pool):
    result, views = run_attack(pytester, monkeypatch, *pool)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_attack.py::test_b_outputs_match*"])
    assert [(view["allclose"], view["equal"], view["sum"]) for view in views] == [(False, False, 4.0)] * 2
    assert not any(view["loaded"]["evil_patch"] for view in views)


def test_installed_modules_a_rank_imported_are_still_preloaded_and_what_was_left_out_is_named(pytester, monkeypatch):
    result, views = run_attack(pytester, monkeypatch)
    result.assert_outcomes(passed=1, failed=1)
    # The later test's rank had them before its call ran: the zygote imported them (a fresh spawned rank has not).
    assert [view["loaded"] for view in views] == [{"evil_patch": False, **dict.fromkeys(INSTALLED, True)}] * 2
    result.stdout.fnmatch_lines(["rank pool: * ranks forked from a zygote; not preloaded, as no installed code: "
                                 "* module* (*evil_patch*)"])


# ---------------------------------------------------------------- an installed module that patches


def test_an_installed_module_that_patches_comparisons_retires_the_template_and_the_summary_says_why(request):
    """A file a test wrote into site-packages is installed code by location; what it did to the template is seen."""
    patch = write_installed_module(request, "patches_comparisons", PATCH)
    launcher = PoolLauncher()
    try:
        assert launcher(2, load, patch, timeout=60, device="cpu")[0].value  # the rank imports it; the zygote too
        launcher.renew()
        views = [result.value for result in launcher(2, compare, timeout=60, device="cpu")]
        assert [(view["allclose"], view["equal"], view["sum"]) for view in views] == [(False, False, 4.0)] * 2
        assert launcher.preload_refused.startswith(
            "the zygote's preloads changed torch.allclose, torch.equal, torch.Tensor.sum")
        assert "importing the functions' modules (the zygote's preloads changed torch.allclose" in launcher.summary()
    finally:
        launcher.close()


def test_without_a_patch_installed_modules_keep_the_template_and_are_preloaded():
    launcher = PoolLauncher()
    try:
        launcher(2, load, "colorsys", timeout=60, device="cpu")
        launcher(2, load, "torch.utils.file_baton", timeout=60, device="cpu")
        launcher.renew()
        views = [result.value for result in launcher(2, compare, timeout=60, device="cpu")]
        assert [view["preloaded"] for view in views] == [dict.fromkeys(INSTALLED, True)] * 2
        assert launcher.preload_refused is None
    finally:
        launcher.close()


# ---------------------------------------------------------------- the rule: where installed code lives
# (imported in each test: the attack above runs, and fails, on code that predates the rule)


def test_the_stdlib_torch_and_site_packages_are_installed_code():
    from harness.ranks.installed import InstalledLocations

    locations = InstalledLocations.of_this_interpreter()
    assert locations.holds(json.__file__)
    assert locations.holds(torch.__file__)
    assert locations.holds_module(sys.modules["torch"].__spec__)
    assert locations.holds_module(sys.modules["sys"].__spec__)  # compiled into the interpreter


def test_what_a_test_can_write_is_not_installed_code(tmp_path):
    import harness
    from harness.ranks.installed import InstalledLocations, installed_roots

    locations = InstalledLocations.of_this_interpreter()
    assert not locations.holds(str(tmp_path / "evil_patch.py"))
    assert not locations.holds(__file__)  # the test folder
    assert not locations.holds(os.path.join(os.getcwd(), "evil_patch.py"))
    # harness installed editable: its files are the checkout, which a test can edit
    if not any(Path(harness.__file__).resolve().is_relative_to(root) for root in installed_roots()):
        assert not locations.holds_module(harness.__spec__)


def test_a_link_in_site_packages_is_where_it_points(tmp_path):
    from harness.ranks.installed import InstalledLocations

    site_packages = tmp_path / "lib" / "site-packages"
    checkout = tmp_path / "checkout"
    site_packages.mkdir(parents=True)
    checkout.mkdir()
    (checkout / "evil_patch.py").write_text(PATCH)
    (site_packages / "evil_patch.py").symlink_to(checkout / "evil_patch.py")
    (site_packages / "linked").symlink_to(checkout, target_is_directory=True)
    (site_packages / "real.py").write_text("")
    locations = InstalledLocations([str(site_packages)], ())
    assert locations.holds(str(site_packages / "real.py"))
    assert not locations.holds(str(site_packages / "evil_patch.py"))
    assert not locations.holds(str(site_packages / "linked" / "evil_patch.py"))
    assert not locations.holds(str(site_packages / ".." / ".." / "checkout" / "evil_patch.py"))


def test_a_folder_tests_write_inside_an_installed_location_is_cut_out_of_it(tmp_path):
    from harness.ranks.installed import InstalledLocations

    site_packages = tmp_path / "site-packages"
    scratch = site_packages / "scratch"
    scratch.mkdir(parents=True)
    locations = InstalledLocations([str(site_packages)], [str(scratch), str(tmp_path)])
    assert locations.holds(str(site_packages / "installed.py"))
    assert not locations.holds(str(scratch / "evil_patch.py"))
    assert locations.entries(["", str(site_packages), str(scratch), str(tmp_path)]) == [str(site_packages)]


def test_a_submodule_a_preload_imports_first_is_no_change_but_anything_else_bound_there_is(monkeypatch):
    """numpy.testing is a name of what verdicts rest on that numpy binds only once imported: a preload importing it
    first (one did on the device's torch 2.11 image) rebinds nothing, and refused every later preload."""
    import types

    from harness.ranks import fingerprint

    package = types.ModuleType("comparing")
    monkeypatch.setitem(sys.modules, "comparing", package)
    monkeypatch.setattr(fingerprint, "FUNCTIONS", {"comparing": ("testing", "allclose")})
    taken = fingerprint.Fingerprint()
    submodule = types.ModuleType("comparing.testing")
    monkeypatch.setitem(sys.modules, "comparing.testing", submodule)
    package.testing = submodule
    assert taken.changes() == []
    package.testing = types.ModuleType("comparing.testing")  # a module, but not the one imported under that name
    package.allclose = lambda *args, **kwargs: True
    assert taken.changes() == ["comparing.testing", "comparing.allclose"]
