"""Finding and loading libsessionflow.

The order (the first that applies wins):
  1. SESSIONFLOW_LIB, when set: that file and nothing else (an explicit choice is never
     silently replaced: if it cannot be loaded, the import fails and says so);
  2. the copy bundled in the wheel, next to this module: sessionflow/_lib/libsessionflow.so;
  3. the system's: ctypes.util.find_library("sessionflow") (the dynamic loader's cache,
     LD_LIBRARY_PATH; e.g. a library installed by Bindings/install.sh and ldconfig).
Otherwise LibraryNotFoundError (an ImportError) says what was tried and how to fix it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Mapping, Optional

ENVIRONMENT_VARIABLE = "SESSIONFLOW_LIB"
BUNDLED_DIRECTORY = Path(__file__).resolve().parent / "_lib"
BUNDLED_NAME = "libsessionflow.so"

_log = logging.getLogger("sessionflow")


class LibraryNotFoundError(ImportError):
    """libsessionflow could not be found or loaded; the message lists what was tried."""


@dataclass(frozen=True)
class LoadedLibrary:
    library: ctypes.CDLL
    path: str
    """What was loaded: a path, or the name the system's loader resolved."""
    source: str
    """"SESSIONFLOW_LIB", "bundled" or "system"."""


_FIX = (
    "To fix: install a sessionflow wheel that bundles the library (Bindings/python/build-wheel.sh "
    "LIBRARY OUTDIR makes one), or install libsessionflow on the system (Bindings/install.sh, then "
    "ldconfig or LD_LIBRARY_PATH), or set SESSIONFLOW_LIB to the path of libsessionflow.so."
)


def load(
    environ: Optional[Mapping[str, str]] = None,
    bundled_directory: Optional[Path] = None,
    find_library: Optional[Callable[[str], Optional[str]]] = None,
) -> LoadedLibrary:
    """Loads the library in the documented order. The parameters exist for the tests."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    directory = BUNDLED_DIRECTORY if bundled_directory is None else bundled_directory
    finder = ctypes.util.find_library if find_library is None else find_library

    explicit = env.get(ENVIRONMENT_VARIABLE)
    if explicit:
        try:
            return LoadedLibrary(ctypes.CDLL(explicit), explicit, ENVIRONMENT_VARIABLE)
        except OSError as error:
            raise LibraryNotFoundError(
                f"libsessionflow: {ENVIRONMENT_VARIABLE}={explicit!r} could not be loaded ({error}). "
                f"An explicit {ENVIRONMENT_VARIABLE} is never replaced by another library: point it at "
                "libsessionflow.so, or unset it to use the bundled or the system's library.",
                name="sessionflow",
                path=explicit,
            ) from error

    tried: List[str] = [f"{ENVIRONMENT_VARIABLE}: not set"]
    bundled = directory / BUNDLED_NAME
    if bundled.exists():
        try:
            return LoadedLibrary(ctypes.CDLL(str(bundled)), str(bundled), "bundled")
        except OSError as error:
            tried.append(f"the bundled {bundled}: present but could not be loaded ({error})")
            _log.warning("the bundled %s could not be loaded (%s): trying the system's library", bundled, error)
    else:
        tried.append(f"the bundled {bundled}: not present (this install bundles no library)")

    name = finder("sessionflow")
    if name:
        try:
            return LoadedLibrary(ctypes.CDLL(name), name, "system")
        except OSError as error:
            tried.append(f"the system's {name} (ctypes.util.find_library): could not be loaded ({error})")
    else:
        tried.append('the system\'s: ctypes.util.find_library("sessionflow") found none')

    raise LibraryNotFoundError(
        "libsessionflow not found. Tried, in this order: " + "; ".join(f"{i}. {t}" for i, t in enumerate(tried, 1))
        + ". " + _FIX,
        name="sessionflow",
    )
