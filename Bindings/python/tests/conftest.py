import os
import sys

# The package from this source tree (src layout). Its library: SESSIONFLOW_LIB (or, without it,
# the system's: see sessionflow._loader).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
