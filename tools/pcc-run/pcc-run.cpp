//===- pcc-run.cpp - run a model library built by pcc ---------------------===//
//
//   pcc-run model.so --input x.npy [--input ...] [--output y.npy ...]
//           [--expect ref.npy ...] [--rtol R --atol A] [--bench N]
//           [--weights file.safetensors] [--device cpu|cuda|cuda:N]
//           [-n RANKS [--hostfile FILE]] [--trace t.json] [--trace-svg t.svg]
//
// Parses the flags and calls the runtime's tooling library (pcc/tooling):
// plain C++, no MLIR. Every failure is one message naming the file, tensor
// or node at fault, and exit status 1.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/ModelLibrary.h"
#include "pcc/tooling/Calibrate.h"
#include "pcc/tooling/Job.h"
#include "pcc/tooling/Run.h"
#include "pcc/tooling/Train.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace pccrt;
using namespace pccrun;

namespace {

const char *kUsage = R"(pcc-run: run a model library built by pcc

Usage:
  pcc-run model.so --input x.npy [--input x2.npy ...] [options]

Options (a value follows its option, or after '=': --steps 10, --steps=10):
  --input FILE       a .npy file per model input, in the model's order
  --output FILE      write the model's outputs (one per output, in order)
  --expect FILE      compare an output with a reference .npy (one per output)
  --rtol R --atol A  comparison tolerances (default 1e-4 and 1e-5)
  --bench N          run N more times and print latency percentiles
  --weights FILE     the weights file (default: the one beside model.so)
  --device DEV       cpu (default), cuda or cuda:N; the library must hold
                     code for it (pcc --target=cpu|cuda|all)
  --info             print the model's signature and exit
  --list-devices     print the devices this machine offers and exit
  --cuda-graph       on cuda, record one run as a CUDA graph and replay it
                     for --bench (checks that the replay matches)
  -n N               run N ranks, one per position of the mesh the library
                     was partitioned for (pcc --tp=N): pcc-run starts them
                     with mpirun, or joins the job when mpirun or srun
                     started it. Each rank reads only its slice of the
                     weights; rank 0 writes and checks the outputs. If a
                     rank dies, mpirun ends the others and the run fails.
  --hostfile FILE    passed to mpirun for runs over several hosts
  --gpu-collectives auto|nccl|staged
                     how GPU ranks exchange device buffers: NCCL (one GPU
                     per rank), or staged through host memory over MPI
                     (several ranks sharing a GPU: a partitioned program
                     checked on one GPU). auto (default): NCCL unless
                     ranks of a host share a GPU. staged on CPU ranks runs
                     the same copies on host memory
  --collective-timeout SECONDS
                     with several ranks: a collective or transfer that
                     waits longer than this (a peer stalled or died) ends
                     the job, naming the rank, its mesh coordinates, the
                     group, the collective and its sequence number
                     (default 300; 0 waits for ever)
  --trace FILE       pipelined libraries (pcc --pp): write every rank's
                     compute, send, receive and idle intervals of the last
                     run as Chrome-trace JSON (chrome://tracing, Perfetto)
                     and print the measured bubble per rank
  --trace-svg FILE   the same timeline as an SVG Gantt chart
  --profile          time every op of the --bench runs (10 runs without
                     --bench) or of the training steps after the first,
                     and print where the time goes: by op kind, by phase,
                     by rank and the costliest ops, with GFLOP/s and GB/s
                     against this CPU's measured peaks
  --profile-trace FILE  rank 0's ops of the last profiled run (or step)
                     as Chrome-trace JSON (with --profile)
  --calibrate FILE   no library: measure this machine's products, copies
                     and (with -n) collectives on --device and write the
                     machine file pcc plan --machine=FILE reads (what
                     pcc calibrate runs); --calibrate-base NAME names the
                     preset for what is not measured, --calibrate-quick
                     measures fewer sizes

Training (a library built by pcc --train):
  --steps N          train until step N (counted from the start of training,
                     also after --resume)
  --input FILE       a .npy per model input with N >= batch rows; step k
                     uses rows [k*B, (k+1)*B) modulo N, in order
  --labels FILE      the labels (.npy): int64 classes for cross_entropy, the
                     float target for mse
  --shuffle SEED     a seeded permutation of the rows per epoch instead
                     (with --data: windows at seeded random offsets)
  --seed N           keys dropout's masks (default 0): the same seed gives
                     the same run; a checkpoint keeps it
  --data FILE --seq S  a token file (uint16, nanoGPT's .bin; --data-dtype
                     int32) cut into windows of S + 1 tokens, one after
                     another, for language models (input: the first S,
                     labels: the last S)
  --lr LR --weight-decay WD --betas B1,B2 --eps E   (AdamW, PyTorch defaults)
  --momentum M --dampening D --nesterov             (SGD)
  --clip-grad-norm MAX  clip the global gradient norm
  --warmup N --schedule-lr constant|cosine|linear [--min-lr LR]
                     linear warmup, then the schedule down to --min-lr
                     (0 by default) at the last step
  --loss-log FILE.csv   step,loss,lr,grad_norm,samples_per_s,step_ms
  --loss-svg FILE.svg   the loss curve
  --save-dir DIR --save-every N   checkpoints (DIR/step-N, DIR/LATEST)
  --save-sharded     every rank writes its own pieces (rank-R.safetensors)
                     instead of rank 0 writing the gathered state
  --resume DIR       continue from a checkpoint (bit-identical to a run
                     that was never interrupted), saved in any layout
  --log-every N      print every N-th step (default 1)

Examples:
  pcc examples/mlp.onnx --batch=2 -o mlp.so
  pcc-run mlp.so --input examples/data/mlp.input.npy --output y.npy \
      --expect examples/data/mlp.output.npy
  pcc examples/mlp.onnx --batch=2 --target=cuda -o mlp-gpu.so
  pcc-run mlp-gpu.so --device cuda --input examples/data/mlp.input.npy \
      --bench 100
  pcc examples/transformer_prenorm.onnx --batch=2 --tp=2 -o enc-tp2.so
  pcc-run -n 2 enc-tp2.so --input examples/data/transformer_prenorm.input.npy \
      --expect examples/data/transformer_prenorm.output.npy
  pcc examples/gpt.onnx --batch=2 --dim=seq=16 --tp=2 --pp=2 \
      --microbatches=2 -o gpt-tp2pp2.so
  pcc-run -n 4 gpt-tp2pp2.so --input examples/data/gpt.input.npy \
      --expect examples/data/gpt.output.npy --trace-svg timeline.svg
  pcc examples/mlp.onnx --train --loss=cross_entropy --batch=8 -o train.so
  pcc-run train.so --steps 200 --input x.npy --labels y.npy --lr 3e-4 \
      --loss-log loss.csv --save-dir ckpt --save-every 50
  pcc-run train.so --steps 400 --input x.npy --labels y.npy --resume ckpt
)";

RunOptions parse(int argc, char **argv) {
  RunOptions o;
  // --flag=value is --flag value.
  std::string flag, inlineValue;
  bool hasInline = false;
  auto value = [&](int &i) -> std::string {
    if (hasInline) {
      hasInline = false;
      return inlineValue;
    }
    if (i + 1 >= argc)
      die(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](int &i) {
    std::string v = value(i);
    char *end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (*end != '\0' || d < 0)
      die(flag + " needs a non-negative number, got '" + v + "'");
    return d;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    int first = i; // this option's first argument, for rankArgs
    hasInline = false;
    if (size_t eq = a.find('=');
        a.rfind("--", 0) == 0 && eq != std::string::npos) {
      inlineValue = a.substr(eq + 1);
      a = a.substr(0, eq);
      hasInline = true;
    }
    flag = a;
    if (a == "-n" || a == "--ranks" || a == "--hostfile") {
      if (a == "--hostfile") {
        o.hostfile = value(i);
        continue;
      }
      double n = number(i);
      if (n < 1 || n != static_cast<int>(n))
        die("-n needs a positive number of ranks");
      o.ranks = static_cast<int>(n);
      continue;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--input") {
      o.inputs.push_back(value(i));
    } else if (a == "--output") {
      o.outputs.push_back(value(i));
    } else if (a == "--expect") {
      o.expects.push_back(value(i));
    } else if (a == "--weights") {
      o.weights = value(i);
    } else if (a == "--device") {
      o.device = value(i);
    } else if (a == "--rtol") {
      o.rtol = number(i);
    } else if (a == "--atol") {
      o.atol = number(i);
    } else if (a == "--bench") {
      o.bench = static_cast<int>(number(i));
    } else if (a == "--trace") {
      o.trace = value(i);
    } else if (a == "--trace-svg") {
      o.traceSvg = value(i);
    } else if (a == "--profile") {
      o.profile = true;
    } else if (a == "--profile-trace") {
      o.profileTrace = value(i);
    } else if (a == "--info") {
      o.info = true;
    } else if (a == "--list-devices") {
      o.listDevices = true;
    } else if (a == "--cuda-graph") {
      o.cudaGraph = true;
    } else if (a == "--calibrate") {
      o.calibrate = value(i);
    } else if (a == "--calibrate-base") {
      o.calibrateBase = value(i);
    } else if (a == "--calibrate-quick") {
      o.calibrateQuick = true;
    } else if (a == "--gpu-collectives") {
      std::string v = value(i);
      if (v == "auto")
        o.gpuCollectives = GpuCollectives::Auto;
      else if (v == "nccl")
        o.gpuCollectives = GpuCollectives::Nccl;
      else if (v == "staged")
        o.gpuCollectives = GpuCollectives::Staged;
      else
        die("--gpu-collectives takes auto, nccl or staged, not '" + v + "'");
    } else if (a == "--collective-timeout") {
      o.collectiveTimeout = number(i);
    } else if (parseTrainOption(a, o.train, [&] { return value(i); })) {
    } else if (!a.empty() && a[0] == '-') {
      die("unknown option '" + a + "' (see --help)");
    } else if (o.library.empty()) {
      o.library = a;
    } else {
      die("unexpected argument '" + a + "' (see --help)");
    }
    if (hasInline)
      die(a + " takes no value (got '" + a + "=" + inlineValue + "')");
    o.rankArgs.insert(o.rankArgs.end(), argv + first, argv + i + 1);
  }
  if (!o.profileTrace.empty() && !o.profile)
    die("--profile-trace writes what --profile measures; add --profile");
  if ((!o.calibrateBase.empty() || o.calibrateQuick) && o.calibrate.empty())
    die("--calibrate-base and --calibrate-quick go with --calibrate FILE");
  if (!o.calibrate.empty() && !o.library.empty())
    die("--calibrate measures the machine, not a library; drop '" + o.library +
        "'");
  if (o.library.empty() && !o.listDevices && o.calibrate.empty())
    die("no model library; usage: pcc-run model.so --input x.npy (see "
        "--help)");
  return o;
}

} // namespace

int main(int argc, char **argv) {
  RunOptions opts = parse(argc, argv);
  if (opts.listDevices)
    return listDevices();
  if (!opts.calibrate.empty()) {
    CalibrateOptions c;
    c.output = opts.calibrate;
    c.base = opts.calibrateBase;
    c.device = opts.device;
    c.hostfile = opts.hostfile;
    c.ranks = opts.ranks;
    c.quick = opts.calibrateQuick;
    c.collectiveTimeout = opts.collectiveTimeout;
    c.rankArgs = opts.rankArgs;
    return runCalibration(c);
  }
  auto library = ModelLibrary::open(opts.library);
  if (!library.ok())
    die(library.error());
  if (library->isTraining() && !opts.info)
    return runTrainingJob(opts, *library);
  if (opts.train.steps > 0 || !opts.train.labels.empty())
    die("'" + opts.library +
        "' is an inference library; compile the model with pcc --train to "
        "train it");
  if (opts.info)
    return printInfo(opts, *library);
  return runInference(opts, *library);
}
