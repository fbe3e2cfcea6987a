"""slick.plugins.load_function, the one loader behind every dotted-path flag: spellings and errors.

The plug-ins are real modules written to tmp_path."""
import itertools
import sys
import textwrap

import pytest

from slick.plugins import load_function

_ids = itertools.count()

MODULE = '''
def fn(x):
    return x + 1


class Scorer:
    @staticmethod
    def score(x):
        return x * 2


NOT_CALLABLE = 3
'''


@pytest.fixture
def mod(tmp_path, monkeypatch):
    name = f"slick_test_load_{next(_ids)}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plug.py").write_text(textwrap.dedent(MODULE))
    (pkg / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    (pkg / "needs_dep.py").write_text("import slick_no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        sys.modules.pop(key)


def test_both_spellings_and_nested_attributes(mod):
    assert load_function(f"{mod}.plug.fn")(1) == 2
    assert load_function(f"{mod}.plug:fn")(1) == 2
    assert load_function(f"  {mod}.plug.fn ")(1) == 2
    assert load_function(f"{mod}.plug:Scorer.score")(3) == 6


def test_unset_passes_through():
    assert load_function(None) is None
    assert load_function("") is None
    assert load_function("   ") is None


@pytest.mark.parametrize("path, message", [
    ("justaname", "--x 'justaname': not a dotted path like 'pkg.module.fn' or 'pkg.module:fn'"),
    ("pkg.mod.", "not a dotted path"),
    (":fn", "not a dotted path"),
    ("pkg.mod:Obj..fn", "not a dotted path"),
    ("slick_no_such_pkg_xyz.fn", "--x 'slick_no_such_pkg_xyz.fn': module 'slick_no_such_pkg_xyz' not found "
                                 "(is it installed or on PYTHONPATH?)"),
])
def test_bad_paths(path, message):
    with pytest.raises(ValueError) as e:
        load_function(path, "--x")
    assert message in str(e.value)


def test_errors_inside_a_module_name_the_cause(mod):
    with pytest.raises(ValueError) as e:
        load_function(f"{mod}.broken.fn", "--custom-rm-path")
    assert str(e.value) == (f"--custom-rm-path '{mod}.broken.fn': importing '{mod}.broken' failed: "
                            f"RuntimeError: boom at import")
    # a missing dependency of an existing module is not "module not found"
    with pytest.raises(ValueError, match="importing .*needs_dep' failed: No module named 'slick_no_such_dependency_xyz'"):
        load_function(f"{mod}.needs_dep.fn", "--x")
    with pytest.raises(ValueError, match=f"'{mod}.plug' has no function 'nope'"):
        load_function(f"{mod}.plug.nope", "--x")
    with pytest.raises(ValueError, match=f"'{mod}.plug.Scorer' has no function 'nope'"):
        load_function(f"{mod}.plug:Scorer.nope", "--x")
    with pytest.raises(ValueError, match="'NOT_CALLABLE' is a int, not a function"):
        load_function(f"{mod}.plug.NOT_CALLABLE", "--x")
    with pytest.raises(ValueError, match="expected a dotted path.*got int 3"):
        load_function(3, "--x")
