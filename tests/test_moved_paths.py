"""Old import paths of code that moved into the architecture folders still work, with a FutureWarning naming the new
home (each check in a fresh interpreter: a module's import-time warning fires once per process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

ARCHITECTURES = ["uniter", "vl_bert", "vilbert", "unified_vlp", "tden"]


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_old_converter_modules_reexport_the_moved_ones_and_warn_once():
    out = _run(
        "import importlib, warnings\n"
        f"for arch in {ARCHITECTURES!r}:\n"
        "    new = importlib.import_module(f'vlhub.modeling.{arch}.convert_{arch}')\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        old = importlib.import_module(f'vlhub.conversion.{arch}')\n"
        "        importlib.import_module(f'vlhub.conversion.{arch}')  # a second import: no second warning\n"
        "    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]\n"
        "    assert len(messages) == 1 and f'vlhub.modeling.{arch}.convert_{arch}' in messages[0], messages\n"
        "    assert set(old.__all__) == set(new.__all__) and old.__all__\n"
        "    assert all(getattr(old, name) is getattr(new, name) for name in new.__all__)\n"
        "    assert old.logger is new.logger  # names outside __all__ too\n"
        "print('ok')\n"
    )
    assert out.split() == ["ok"]


def test_old_converter_module_names_what_it_lacks():
    out = _run(
        "import warnings\n"
        "warnings.simplefilter('ignore', FutureWarning)\n"
        "import vlhub.conversion.uniter as old\n"
        "try:\n"
        "    old.no_such_name\n"
        "except AttributeError as error:\n"
        "    print('no_such_name' in str(error))\n"
    )
    assert out.split() == ["True"]
