# -*- Python -*-
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "PCC"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test", ".onnxtxt"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.pcc_obj_root, "test")

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%pcc_src_root", config.pcc_src_root))
config.substitutions.append(("%examples", os.path.join(config.pcc_src_root, "examples")))
config.substitutions.append(("%onnx_testdata", "/usr/share/libonnx-testdata/data"))
config.substitutions.append(("%runtime_include", os.path.join(config.pcc_src_root, "runtime", "include")))
config.substitutions.append(("%runtime_lib", os.path.join(config.pcc_obj_root, "lib")))
config.substitutions.append(("%python", "/usr/bin/python3"))

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

tool_dirs = [config.pcc_tools_dir, config.llvm_tools_dir]
tools = ["pcc", "pcc-opt", "pcc-translate", "pcc-onnx-conformance", "pcc-run",
         "not", "count",
         "pcc-fd-gradients",
         "split-file", "pcc-collective-tests"]
llvm_config.add_tool_substitutions(tools, tool_dirs)

if os.path.isdir("/usr/share/libonnx-testdata/data/node"):
    config.available_features.add("onnx-testdata")

# The CUDA backend builds wherever nvcc is (CI included); running it needs a
# GPU, which `pcc-run --list-devices` looks for. Tests that need either say
# so with REQUIRES, and lit reports them as unsupported elsewhere.
import subprocess
try:
    devices = subprocess.run(
        [os.path.join(config.pcc_tools_dir, "pcc-run"), "--list-devices"],
        capture_output=True, text=True, timeout=60).stdout
except (OSError, subprocess.SubprocessError):
    devices = ""
if config.pcc_have_cuda:
    config.available_features.add("cuda-toolkit")
    if "cuda:0" in devices:
        config.available_features.add("cuda-gpu")

# bf16 products through oneDNN's own bf16 kernels (AVX512 or AMX); on a CPU
# without them (AVX2 only) they widen to fp32 and run its sgemm, whose
# rounding depends on how the rows are split over threads and ranks. Tests
# of bitwise equality across layouts in bf16 need the former.
if "bf16 products: oneDNN" in devices:
    config.available_features.add("cpu-bf16-kernels")

# CPU ranks under OpenMPI (as root it needs --allow-run-as-root; two cores
# need --oversubscribe for four ranks).
if config.pcc_have_mpi:
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun:
        config.available_features.add("mpi")
        config.substitutions.append(
            ("%mpirun", mpirun + " --allow-run-as-root --oversubscribe --bind-to none"))

# onnxruntime, where the zoo's virtual environment (scripts/zoo/setup-venv.sh)
# has it: tests that check exported models with it say REQUIRES: onnxruntime.
zoo_python = os.path.expanduser("~/.cache/pcc/zoo-venv/bin/python")
if os.path.exists(zoo_python):
    import subprocess
    try:
        ok = subprocess.run([zoo_python, "-c", "import onnxruntime"],
                            capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if ok:
        config.available_features.add("onnxruntime")
        config.substitutions.append(("%ort_python", zoo_python))
