//===- Train.cpp - pcc-run's training mode --------------------------------===//
//
// Feeds a training library (pcc --train) its batches, step after step: the
// rows of the user's arrays in order (or a seeded permutation per epoch),
// or windows of a token file; scales the gradient by one over the labels of
// the whole step; prints progress, logs the loss, draws the curve and
// writes checkpoints that resume bit for bit.
//
//===----------------------------------------------------------------------===//

#include "pcc/tooling/Train.h"

#include "pcc/tooling/Profile.h"
#include "pcc/tooling/Trace.h"

#include "pcc/runtime/Checkpoint.h"
#include "pcc/runtime/Npy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace pccrt {

namespace {

/// The job's world while training: a rank that fails ends the job through
/// it, so the others are not left waiting for it in a collective.
Communicator *failWorld = nullptr;

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "pcc-run: error: %s\n", message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (failWorld)
    failWorld->abortJob(1);
  std::exit(1);
}

double parseNumber(const std::string &option, const std::string &text) {
  char *end = nullptr;
  double d = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(d))
    fail(option + " needs a number, got '" + text + "'");
  return d;
}

int64_t parseCount(const std::string &option, const std::string &text) {
  double d = parseNumber(option, text);
  if (d < 0 || d != std::floor(d))
    fail(option + " needs a non-negative integer, got '" + text + "'");
  return static_cast<int64_t>(d);
}

/// splitmix64: the shuffles' generator (simple enough for a reference
/// framework to replay).
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Epoch `epoch`'s permutation of n rows: Fisher-Yates from the last row
/// down, swapping row i with splitmix64(seed + epoch * 2^32 + i) % (i + 1).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i)
    perm[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    uint64_t r = splitmix64(seed + (static_cast<uint64_t>(epoch) << 32) +
                            static_cast<uint64_t>(i));
    std::swap(perm[i], perm[r % static_cast<uint64_t>(i + 1)]);
  }
  return perm;
}

/// The step's data: for every micro-batch, every forward input's bytes.
class DataSource {
public:
  virtual ~DataSource() = default;
  /// Fills micro-batch `j` of step `k` (0-based).
  virtual void fill(int64_t k, int64_t j,
                    std::vector<std::vector<uint8_t>> &buffers) = 0;
  virtual std::string describe() const = 0;
  /// Tokens per sample (0: not a token stream).
  virtual int64_t tokensPerSample() const { return 0; }
};

/// Rows of .npy arrays, in order or shuffled per epoch.
class ArraySource final : public DataSource {
public:
  ArraySource(std::vector<NpyArray> arrays, std::vector<std::string> names,
              int64_t rows, int64_t microRows, int64_t batch,
              std::optional<uint64_t> shuffle)
      : arrays(std::move(arrays)), names(std::move(names)), rows(rows),
        microRows(microRows), batch(batch), shuffle(shuffle) {}

  void fill(int64_t k, int64_t j,
            std::vector<std::vector<uint8_t>> &buffers) override {
    for (size_t a = 0; a < arrays.size(); ++a) {
      size_t rowBytes = arrays[a].data.size() / rows;
      for (int64_t r = 0; r < microRows; ++r) {
        int64_t g = k * batch + j * microRows + r;
        int64_t row = rowOf(g);
        std::memcpy(buffers[a].data() + r * rowBytes,
                    arrays[a].data.data() + row * rowBytes, rowBytes);
      }
    }
  }
  std::string describe() const override {
    std::string s = std::to_string(rows) + " rows of";
    for (const std::string &n : names)
      s += " " + n;
    return s + (shuffle ? ", shuffled per epoch (seed " +
                              std::to_string(*shuffle) + ")"
                        : ", in order");
  }

private:
  int64_t rowOf(int64_t g) {
    int64_t epoch = g / rows, pos = g % rows;
    if (!shuffle)
      return pos;
    if (epoch != cachedEpoch) {
      perm = permutation(rows, *shuffle, epoch);
      cachedEpoch = epoch;
    }
    return perm[pos];
  }
  std::vector<NpyArray> arrays;
  std::vector<std::string> names;
  int64_t rows, microRows, batch;
  std::optional<uint64_t> shuffle;
  std::vector<int64_t> perm;
  int64_t cachedEpoch = -1;
};

/// Windows of a token file (nanoGPT's uint16 .bin, or int32): sample g
/// reads tokens [s, s + seq] with s = g * seq mod (T - seq), or a seeded
/// random start with --shuffle; the input is the first seq tokens, the
/// labels the last seq.
class TokenSource final : public DataSource {
public:
  TokenSource(std::vector<int64_t> tokens, int64_t seq, int64_t microRows,
              int64_t batch, DType idType, DType labelType,
              std::optional<uint64_t> shuffle)
      : tokens(std::move(tokens)), seq(seq), microRows(microRows), batch(batch),
        idType(idType), labelType(labelType), shuffle(shuffle) {}

  void fill(int64_t k, int64_t j,
            std::vector<std::vector<uint8_t>> &buffers) override {
    int64_t span = static_cast<int64_t>(tokens.size()) - seq;
    for (int64_t r = 0; r < microRows; ++r) {
      int64_t g = k * batch + j * microRows + r;
      int64_t start =
          shuffle ? static_cast<int64_t>(
                        splitmix64(*shuffle ^ (static_cast<uint64_t>(g) *
                                               0x9e3779b97f4a7c15ull)) %
                        static_cast<uint64_t>(span))
                  : (g * seq) % span;
      for (int64_t t = 0; t < seq; ++t) {
        put(buffers[0], idType, r * seq + t, tokens[start + t]);
        put(buffers[1], labelType, r * seq + t, tokens[start + t + 1]);
      }
    }
  }
  std::string describe() const override {
    return std::to_string(tokens.size()) + " tokens, windows of " +
           std::to_string(seq) +
           (shuffle ? " at seeded random offsets" : " one after another");
  }
  int64_t tokensPerSample() const override { return seq; }

private:
  static void put(std::vector<uint8_t> &buffer, DType type, int64_t i,
                  int64_t v) {
    if (type == DType::I64)
      reinterpret_cast<int64_t *>(buffer.data())[i] = v;
    else
      reinterpret_cast<int32_t *>(buffer.data())[i] = static_cast<int32_t>(v);
  }
  std::vector<int64_t> tokens;
  int64_t seq, microRows, batch;
  DType idType, labelType;
  std::optional<uint64_t> shuffle;
};

/// Integer .npy arrays of another width are widened or narrowed to the
/// model's index type; anything else must match exactly.
NpyArray convertTo(NpyArray a, DType want, const std::string &file) {
  if (a.dtype == want)
    return a;
  bool fromInt = a.dtype == DType::I64 || a.dtype == DType::I32;
  bool toInt = want == DType::I64 || want == DType::I32;
  if (!fromInt || !toInt)
    fail("'" + file + "' holds " + std::string(dtypeName(a.dtype)) +
         " but the model takes " + std::string(dtypeName(want)));
  int64_t n = elementCount(a.shape);
  NpyArray out;
  out.dtype = want;
  out.shape = a.shape;
  out.data.resize(n * dtypeSize(want));
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = a.dtype == DType::I64
                    ? reinterpret_cast<const int64_t *>(a.data.data())[i]
                    : reinterpret_cast<const int32_t *>(a.data.data())[i];
    if (want == DType::I64)
      reinterpret_cast<int64_t *>(out.data.data())[i] = v;
    else
      reinterpret_cast<int32_t *>(out.data.data())[i] = static_cast<int32_t>(v);
  }
  return out;
}

/// The learning rate of step s (from 1): linear warmup over `warmup`
/// steps, then constant, cosine to 0 or linear to 0 at the last step.
double learningRate(const TrainOptions &o, int64_t s) {
  double lr = o.hyper.lr;
  if (o.warmup > 0 && s <= o.warmup)
    return lr * static_cast<double>(s) / static_cast<double>(o.warmup);
  if (o.schedule == "constant")
    return lr;
  double span = static_cast<double>(std::max<int64_t>(o.steps - o.warmup, 1));
  double p = std::clamp(static_cast<double>(s - o.warmup) / span, 0.0, 1.0);
  if (o.schedule == "cosine")
    return o.minLr + (lr - o.minLr) * 0.5 * (1.0 + std::cos(M_PI * p));
  return o.minLr + (lr - o.minLr) * (1.0 - p);
}

/// The loss curve as an SVG line chart.
void writeSvg(const std::string &path,
              const std::vector<std::pair<int64_t, double>> &points,
              const std::string &title) {
  const double w = 640, h = 360, left = 60, right = 20, top = 30, bottom = 40;
  double lo = INFINITY, hi = -INFINITY;
  int64_t first = points.front().first, last = points.back().first;
  for (auto &p : points)
    if (std::isfinite(p.second)) {
      lo = std::min(lo, p.second);
      hi = std::max(hi, p.second);
    }
  if (!(hi > lo)) {
    hi = lo + 1;
  }
  double pad = (hi - lo) * 0.05;
  lo -= pad;
  hi += pad;
  auto x = [&](int64_t s) {
    return left + (w - left - right) *
                      (last == first ? 0.5
                                     : static_cast<double>(s - first) /
                                           static_cast<double>(last - first));
  };
  auto y = [&](double v) {
    return top + (h - top - bottom) * (1.0 - (v - lo) / (hi - lo));
  };
  std::ofstream out(path);
  if (!out)
    fail("cannot write --loss-svg '" + path + "'");
  char buf[256];
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w
      << "\" height=\"" << h << "\" font-family=\"sans-serif\" "
      << "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      << "fill=\"white\"/>\n";
  out << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\">" << title
      << "</text>\n";
  for (int i = 0; i <= 4; ++i) {
    double v = lo + (hi - lo) * i / 4.0;
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" "
                  "stroke=\"#ddd\"/><text x=\"%g\" y=\"%.1f\" "
                  "text-anchor=\"end\">%.3g</text>\n",
                  left, y(v), w - right, y(v), left - 6, y(v) + 4, v);
    out << buf;
  }
  std::snprintf(buf, sizeof(buf),
                "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>"
                "<text x=\"%g\" y=\"%g\">%lld</text><text x=\"%g\" y=\"%g\" "
                "text-anchor=\"end\">%lld</text>\n",
                (left + w - right) / 2, h - 8, left, h - bottom + 16,
                static_cast<long long>(first), w - right, h - bottom + 16,
                static_cast<long long>(last));
  out << buf << "<polyline fill=\"none\" stroke=\"#1f77b4\" "
      << "stroke-width=\"1.5\" points=\"";
  for (auto &p : points)
    if (std::isfinite(p.second)) {
      std::snprintf(buf, sizeof(buf), "%.1f,%.1f ", x(p.first), y(p.second));
      out << buf;
    }
  out << "\"/>\n</svg>\n";
}

std::string hyperDescription(const TrainOptions &o, const char *optimizer) {
  char buf[256];
  const Hyperparameters &h = o.hyper;
  if (std::string(optimizer) == "sgd")
    std::snprintf(buf, sizeof(buf), "sgd lr %g momentum %g%s weight-decay %g",
                  h.lr, h.momentum, h.nesterov ? " (nesterov)" : "",
                  h.weightDecay);
  else
    std::snprintf(buf, sizeof(buf),
                  "adamw lr %g betas %g,%g eps %g weight-decay %g", h.lr,
                  h.beta1, h.beta2, h.eps, h.weightDecay);
  std::string s = buf;
  if (h.maxGradNorm > 0) {
    std::snprintf(buf, sizeof(buf), ", clip-grad-norm %g", h.maxGradNorm);
    s += buf;
  }
  if (o.warmup > 0)
    s += ", warmup " + std::to_string(o.warmup);
  if (o.schedule != "constant") {
    std::snprintf(buf, sizeof(buf), ", %s schedule to %g", o.schedule.c_str(),
                  o.minLr);
    s += buf;
  }
  return s;
}

/// Refuses options that cannot train this library, and sets what follows
/// from the optimizer (SGD's weight decay default).
void checkOptions(TrainOptions &o, const std::string &optimizer) {
  if (o.steps < 1)
    fail("training needs --steps N: the step at which the run ends");
  if (o.schedule != "constant" && o.schedule != "cosine" &&
      o.schedule != "linear")
    fail("--schedule-lr " + o.schedule +
         " is not a schedule (constant, "
         "cosine or linear)");
  if (!(o.hyper.lr > 0))
    fail("--lr must be positive");
  if (o.minLr < 0 || o.minLr > o.hyper.lr)
    fail("--min-lr must lie between 0 and --lr");
  if (optimizer == "sgd" && !o.weightDecayGiven)
    o.hyper.weightDecay = 0; // PyTorch's SGD default
  if (optimizer != "sgd" && (o.hyper.momentum != 0 || o.hyper.nesterov))
    fail("--momentum and --nesterov are SGD's; this library was compiled "
         "with --optimizer=" +
         optimizer);
  if (o.hyper.nesterov && o.hyper.momentum <= 0)
    fail("--nesterov needs --momentum above 0 (as torch.optim.SGD)");
  if (!o.saveDir.empty() && o.saveEvery < 0)
    fail("--save-every must be positive");
}

/// The training data: --data's token windows for a language model, or
/// --input and --labels arrays, cut into micro-batches of `microRows` rows
/// of the forward phase's shapes, `batch` rows a step.
std::unique_ptr<DataSource> openData(const TrainOptions &o,
                                     const pcc_model_info &info,
                                     int64_t microRows, int64_t batch) {
  const pcc_tensor_spec *inputs = info.inputs;
  int nin = info.num_inputs;
  std::string loss = info.loss;
  std::unique_ptr<DataSource> source;
  if (!o.data.empty()) {
    if (!o.inputs.empty() || !o.labels.empty())
      fail("--data gives both the inputs and the labels; drop --input and "
           "--labels");
    if (nin != 2 || inputs[0].rank != 2 || inputs[1].rank != 2)
      fail("--data feeds language models with one [batch, seq] input of "
           "token ids and labels of the same shape; this model takes " +
           std::to_string(nin - 1) + " input(s)");
    int64_t seq = inputs[0].shape[1];
    if (o.seq && o.seq != seq)
      fail("--seq " + std::to_string(o.seq) +
           " does not match the model, "
           "which was compiled for sequences of " +
           std::to_string(seq) + " (pcc --dim=seq=" + std::to_string(o.seq) +
           ")");
    if (o.dataDtype != "uint16" && o.dataDtype != "int32")
      fail("--data-dtype " + o.dataDtype + " is not uint16 or int32");
    auto text = readTextFile(o.data);
    if (!text.ok())
      fail("cannot read --data '" + o.data + "'");
    size_t width = o.dataDtype == "uint16" ? 2 : 4;
    if (text->size() % width)
      fail("--data '" + o.data + "' is not a whole number of " + o.dataDtype +
           " tokens");
    std::vector<int64_t> tokens(text->size() / width);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (width == 2) {
        uint16_t t;
        std::memcpy(&t, text->data() + 2 * i, 2);
        tokens[i] = t;
      } else {
        int32_t t;
        std::memcpy(&t, text->data() + 4 * i, 4);
        tokens[i] = t;
      }
    }
    if (static_cast<int64_t>(tokens.size()) <= seq + 1)
      fail("--data '" + o.data + "' holds " + std::to_string(tokens.size()) +
           " tokens, fewer than one window of " + std::to_string(seq + 1));
    source = std::make_unique<TokenSource>(
        std::move(tokens), seq, microRows, batch,
        static_cast<DType>(inputs[0].dtype),
        static_cast<DType>(inputs[1].dtype), o.shuffle);
  } else {
    if (static_cast<int>(o.inputs.size()) != nin - 1)
      fail("the model takes " + std::to_string(nin - 1) +
           " input(s) and labels: give --input for each input and --labels "
           "(or --data tokens.bin for a language model)");
    if (o.labels.empty())
      fail("training needs --labels FILE.npy (" +
           std::string(loss == "mse" ? "the target of the model's output"
                                     : "the class of every example") +
           ")");
    std::vector<NpyArray> arrays;
    std::vector<std::string> files(o.inputs);
    files.push_back(o.labels);
    int64_t rows = -1;
    for (int i = 0; i < nin; ++i) {
      auto a = readNpy(files[i]);
      if (!a.ok())
        fail(a.error());
      NpyArray array =
          convertTo(a.take(), static_cast<DType>(inputs[i].dtype), files[i]);
      std::vector<int64_t> want = specShape(inputs[i]);
      std::vector<int64_t> got = array.shape;
      if (got.empty() || want.empty() ||
          std::vector<int64_t>(got.begin() + 1, got.end()) !=
              std::vector<int64_t>(want.begin() + 1, want.end()))
        fail("'" + files[i] + "' is " + shapeString(got) + " but the model's " +
             inputs[i].name + " is [N, ...] with rows of " +
             shapeString(std::vector<int64_t>(want.begin() + 1, want.end())) +
             " (the rows are examples)");
      if (rows >= 0 && got[0] != rows)
        fail("'" + files[i] + "' holds " + std::to_string(got[0]) +
             " rows but '" + files[0] + "' holds " + std::to_string(rows) +
             "; every --input and --labels file needs the same rows");
      rows = got[0];
      arrays.push_back(std::move(array));
    }
    if (rows < batch)
      fail("the data holds " + std::to_string(rows) +
           " rows, fewer than one "
           "batch of " +
           std::to_string(batch) + " (pcc --batch)");
    std::vector<std::string> names;
    for (int i = 0; i < nin; ++i)
      names.push_back(inputs[i].name);
    source = std::make_unique<ArraySource>(std::move(arrays), names, rows,
                                           microRows, batch, o.shuffle);
  }
  return source;
}

/// fp16 training's loss scaling (pcc --precision=fp16 --loss-scale), as
/// PyTorch's GradScaler: the loss gradient is multiplied by `scale`, the
/// optimizer unscales the gradients and skips a step whose gradients
/// overflowed (their norm is not finite); then a dynamic scale halves, and
/// doubles after `window` steps in a row without an overflow.
struct LossScaler {
  double scale = 0;
  int64_t window = 0, tracker = 0, skipped = 0, overflowsInARow = 0;

  explicit LossScaler(const pcc_model_info &info)
      : scale(info.loss_scale), window(info.loss_scale_window) {}
  bool on() const { return scale > 0; }
  /// After a step with the scale `scale`: whether it overflowed.
  void update(bool overflow) {
    if (!on())
      return;
    if (overflow) {
      ++skipped;
      ++overflowsInARow;
      if (window > 0) {
        scale *= 0.5;
        tracker = 0;
      }
      return;
    }
    overflowsInARow = 0;
    if (window > 0 && ++tracker == window) {
      scale *= 2;
      tracker = 0;
    }
  }
};

/// Loads the weights file of `library` into `trainer`, or --resume's
/// checkpoint (weights and optimizer state, and the run's seed into
/// `hyper`); returns the step it starts after.
int64_t loadState(const TrainOptions &o, Trainer &trainer,
                  const ModelLibrary &library, const std::string &optimizer,
                  Hyperparameters &hyper, LossScaler &scaler) {
  int64_t start = 0;
  if (!o.resume.empty() && !o.weights.empty())
    fail("--weights and --resume: a resumed run takes its weights from the "
         "checkpoint '" +
         o.resume + "'");
  if (!o.resume.empty()) {
    auto dir = openCheckpoint(o.resume, /*verifyChecksums=*/false);
    if (!dir.ok())
      fail(dir.error());
    auto text = readTextFile(*dir + "/trainer.json");
    nlohmann::json state = text.ok()
                               ? nlohmann::json::parse(*text, nullptr, false)
                               : nlohmann::json();
    if (state.is_discarded() || !state.contains("step"))
      fail("checkpoint '" + *dir + "': trainer.json is unreadable");
    if (state.value("optimizer", "") != optimizer)
      fail("checkpoint '" + *dir + "' holds " +
           state.value("optimizer", std::string("no")) +
           " optimizer state; this library trains with " + optimizer);
    start = state["step"].get<int64_t>();
    // Dropout's masks depend on the seed: a resumed run keeps it.
    uint64_t saved = state.value("seed", uint64_t(0));
    if (o.seed && *o.seed != saved)
      fail("checkpoint '" + *dir + "' was trained with --seed " +
           std::to_string(saved) + "; resuming with --seed " +
           std::to_string(*o.seed) + " would not continue the same run");
    hyper.seed = saved;
    // fp16: the loss scaler goes on where it stopped (a checkpoint of
    // another precision has none: the library's initial scale).
    if (scaler.on() && state.contains("loss_scale")) {
      scaler.scale = state["loss_scale"].get<double>();
      scaler.tracker = state.value("loss_scale_tracker", int64_t(0));
      scaler.skipped = state.value("skipped_steps", int64_t(0));
    }
    // Each rank reads its own pieces of the state it holds, from the files
    // that hold them (all of them when the layout changed).
    auto reader = CheckpointReader::open(*dir);
    if (!reader.ok())
      fail(reader.error());
    for (int32_t kind : {PCC_STATE_WEIGHT, PCC_STATE_OPTIMIZER}) {
      Status loaded = trainer.load(*reader, kind);
      if (!loaded.ok())
        fail(loaded.error());
    }
    if (reader->sharded())
      std::printf("resumed from %s at step %lld (rank 0 read %lld of the "
                  "%lld shard files: those holding its pieces)\n",
                  dir->c_str(), static_cast<long long>(start),
                  static_cast<long long>(reader->filesRead()),
                  static_cast<long long>(reader->files()));
    else
      std::printf("resumed from %s at step %lld\n", dir->c_str(),
                  static_cast<long long>(start));
    if (start >= o.steps)
      fail("checkpoint '" + *dir + "' is at step " + std::to_string(start) +
           "; --steps " + std::to_string(o.steps) +
           " is the step the run ends at (counted from the start of "
           "training), so there is nothing left to do");
  } else {
    std::string path =
        o.weights.empty() ? library.defaultWeightsPath() : o.weights;
    auto weights = CheckpointReader::fromFile(path, "weight");
    if (!weights.ok())
      fail(weights.error());
    Status loaded = trainer.load(*weights, PCC_STATE_WEIGHT);
    if (!loaded.ok())
      fail(loaded.error());
  }
  return start;
}

/// Opens --loss-log for writing. A resumed run keeps the rows up to its
/// checkpoint (a killed run may have logged steps after it, which are
/// done again) and continues the step numbers.
FILE *openLossLog(const TrainOptions &o, int64_t start, bool lossScale) {
  std::string kept = lossScale
                         ? "step,loss,lr,grad_norm,samples_per_s,step_ms,"
                           "loss_scale\n"
                         : "step,loss,lr,grad_norm,samples_per_s,step_ms\n";
  if (start > 0) {
    std::ifstream existing(o.lossLog);
    std::string line;
    if (std::getline(existing, line))
      while (std::getline(existing, line)) {
        long long step = 0;
        if (std::sscanf(line.c_str(), "%lld,", &step) == 1 && step <= start)
          kept += line + "\n";
      }
  }
  FILE *log = std::fopen(o.lossLog.c_str(), "w");
  if (!log)
    fail("cannot write --loss-log '" + o.lossLog + "'");
  std::fputs(kept.c_str(), log);
  return log;
}

/// What the loss of one micro-batch with `labels` is normalised by: its
/// labels that are not ignored (cross_entropy), its elements (mse), or 1.
double labelCount(const pcc_model_info &info, const uint8_t *labels) {
  const pcc_tensor_spec &spec = info.inputs[info.num_inputs - 1];
  int64_t n = elementCount(specShape(spec));
  std::string loss = info.loss;
  if (loss == "mse")
    return static_cast<double>(n);
  if (loss != "cross_entropy")
    return 1;
  double count = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = spec.dtype == static_cast<int32_t>(DType::I64)
                    ? reinterpret_cast<const int64_t *>(labels)[i]
                    : reinterpret_cast<const int32_t *>(labels)[i];
    count += v != info.ignore_index;
  }
  return count;
}

/// The bytes the library's collectives have moved so far (not the
/// checkpoints' gathers): over the dp axis (gradients, ZeRO's gathers) or,
/// `overTp`, over the tp axis (activations and their gradients); a
/// pipeline's (tied weights' gradients, the norm, the losses) in neither.
CommBinding::Traffic collectiveTraffic(const pcc_model_info &info,
                                       const pcc_comm *comms, bool overTp) {
  CommBinding::Traffic t;
  for (int a = 0; comms && a < info.num_mesh_axes; ++a) {
    if ((std::string(info.mesh_axes[a]) == PCC_MESH_AXIS_TP) != overTp ||
        a == info.pipeline_axis)
      continue;
    const auto &m = static_cast<const CommBinding *>(comms[a].group)->traffic();
    t.allReduce += m.allReduce;
    t.allGather += m.allGather;
    t.reduceScatter += m.reduceScatter;
    t.calls += m.calls;
    t.started += m.started;
    t.startedGathers += m.startedGathers;
    t.seconds += m.seconds;
  }
  return t;
}

/// Adds what moved between `before` and `after` to `into`.
void addTraffic(CommBinding::Traffic &into, const CommBinding::Traffic &before,
                const CommBinding::Traffic &after) {
  into.allReduce += after.allReduce - before.allReduce;
  into.allGather += after.allGather - before.allGather;
  into.reduceScatter += after.reduceScatter - before.reduceScatter;
  into.calls += after.calls - before.calls;
  into.started += after.started - before.started;
  into.startedGathers += after.startedGathers - before.startedGathers;
  into.seconds += after.seconds - before.seconds;
}

/// Prints the collectives' traffic per step (over `steps` steps): over tp,
/// and over dp in the ZeRO paper's units with the time waited for them.
void reportCommunication(const pcc_model_info &info, const Trainer &trainer,
                         const CommBinding::Traffic &tpTraffic,
                         const CommBinding::Traffic &stepTraffic,
                         int64_t trafficSteps) {
  if (tpTraffic.calls > 0) {
    double n = static_cast<double>(trafficSteps);
    std::printf("tensor-parallel communication per step on each rank: %.3f "
                "MiB (all-reduce %.3f, reduce-scatter %.3f, all-gather %.3f "
                "MiB; %.0f collectives: activations, their gradients and the "
                "gradient norm)\n",
                tpTraffic.total() / n / 1048576.0,
                tpTraffic.allReduce / n / 1048576.0,
                tpTraffic.reduceScatter / n / 1048576.0,
                tpTraffic.allGather / n / 1048576.0, tpTraffic.calls / n);
  }
  if (stepTraffic.calls > 0) {
    // In the ZeRO paper's units: Psi trainable parameters of 4 bytes, of
    // this rank's tensor-parallel piece of the model (of its pipeline
    // rank's stages).
    int64_t psi = 0;
    for (int i = 0; i < info.num_weights; ++i) {
      if (info.weight_kinds[i] != PCC_STATE_GRAD || !trainer.holds(i))
        continue;
      const pcc_weight_shard &shard = info.weight_shards[i];
      int32_t split = shard.dim >= 0 ? shard.axis : shard.within_axis;
      psi += elementCount(specShape(info.whole_weights[i])) /
             (split >= 0 ? info.mesh_sizes[split] : 1);
    }
    double n = static_cast<double>(trafficSteps);
    double unit = 4.0 * static_cast<double>(std::max<int64_t>(psi, 1));
    std::printf("communication per step on each rank: %.3f Psi = %.3f MiB "
                "(all-reduce %.3f, reduce-scatter %.3f, all-gather %.3f "
                "MiB; %.0f collectives; Psi = %lld trainable parameters x 4 "
                "bytes; a ring sends (n - 1) / n of it)\n",
                stepTraffic.total() / n / unit,
                stepTraffic.total() / n / 1048576.0,
                stepTraffic.allReduce / n / 1048576.0,
                stepTraffic.reduceScatter / n / 1048576.0,
                stepTraffic.allGather / n / 1048576.0, stepTraffic.calls / n,
                static_cast<long long>(psi));
    // What the rank waited for them: blocking collectives whole, started
    // ones (gradient buckets, prefetched weight gathers) only where they
    // were not done by the time they were needed (bench/dp_overlap.py
    // compares the two).
    bool buckets = stepTraffic.started > stepTraffic.startedGathers;
    bool gathers = stepTraffic.startedGathers > 0;
    std::printf("time in data-parallel collectives per step on each rank: "
                "%.3f ms (%s)\n",
                stepTraffic.seconds / n * 1e3,
                buckets && gathers
                    ? "gradient buckets started during the backward pass "
                      "and weight gathers started ahead; the time waited "
                      "for them"
                : buckets ? "gradient buckets started during the backward "
                            "pass; the time waited for them"
                : gathers ? "weight gathers started ahead (ZeRO-3 "
                            "prefetch); the time waited for them"
                          : "blocking");
  }
}

/// What a checkpoint's trainer.json records about the run.
struct RunFacts {
  const std::string &libraryPath, &loss, &optimizer;
  int64_t batch, microbatches, dp, tp;
};

/// Writes the checkpoint of `step` into --save-dir (with fp16, the loss
/// scaler's state as it enters step + 1). Every rank gathers the
/// whole state (ZeRO-sharded tensors are all-gathered over dp; replicated
/// ones are the same on every rank), and rank 0 writes it in the
/// one-device format, which any layout loads; with --save-sharded each rank
/// writes its pieces.
void saveCheckpoint(const TrainOptions &o, const pcc_model_info &info,
                    const RunFacts &facts, const TrainRanks &ranks,
                    Trainer &trainer, uint64_t seed, int64_t step,
                    const LossScaler &scaler) {
  std::optional<SafetensorsWriter> weights, opt, shard;
  if (o.saveSharded) {
    int64_t held = 0;
    auto mine = trainer.saveShard(&held);
    if (!mine.ok())
      fail(mine.error());
    if (held > 0)
      shard.emplace(mine.take());
  } else {
    auto w = trainer.save(PCC_STATE_WEIGHT, "weights");
    auto p = trainer.save(PCC_STATE_OPTIMIZER, "optimizer state");
    if (!w.ok() || !p.ok())
      fail(w.ok() ? p.error() : w.error());
    weights.emplace(w.take());
    opt.emplace(p.take());
  }
  if (!ranks.leader && !o.saveSharded)
    return;
  nlohmann::json state = {{"step", step},
                          {"model", info.source},
                          {"library", facts.libraryPath},
                          {"loss", facts.loss},
                          {"optimizer", facts.optimizer},
                          {"batch", facts.batch},
                          {"microbatches", facts.microbatches},
                          {PCC_MESH_AXIS_DP, facts.dp},
                          {PCC_MESH_AXIS_TP, facts.tp},
                          {"zero", info.zero_stage},
                          {"samples_seen", step * facts.batch}};
  if (o.shuffle)
    state["shuffle"] = *o.shuffle;
  state["seed"] = seed;
  if (scaler.on()) {
    state["loss_scale"] = scaler.scale;
    state["loss_scale_tracker"] = scaler.tracker;
    state["skipped_steps"] = scaler.skipped;
  }
  const char *crash = std::getenv("PCC_TEST_CRASH_IN_SAVE");
  bool crashNow = crash && std::atoll(crash) == step;
  state["sharded"] = o.saveSharded;
  Result<std::string> dir = std::string();
  if (o.saveSharded)
    dir = writeShardedCheckpoint(
        o.saveDir, step, static_cast<int>(ranks.worldRank),
        shard ? &*shard : nullptr, state.dump(2) + "\n", [&]() {
          return ranks.world ? ranks.world->barrier() : Status::success();
        });
  else
    dir = writeCheckpoint(
        o.saveDir, step,
        {{"weights.safetensors", &*weights}, {"optimizer.safetensors", &*opt}},
        state.dump(2) + "\n", crashNow);
  if (!dir.ok())
    fail(dir.error());
  std::printf("saved %s%s\n", dir->c_str(),
              o.saveSharded ? " (sharded: each rank wrote its pieces)" : "");
}

/// A pipelined run's report: every pipeline rank's memory high-water mark,
/// its stash, and with --trace or --trace-svg the last step's timeline.
void reportPipeline(const TrainOptions &o, const ModelLibrary &library,
                    const Device &device, const TrainRanks &ranks,
                    const Trainer &trainer) {
  const pcc_model_info &info = library.info();
  if (ranks.world) {
    // Every pipeline rank's high-water mark (the most of its tp x dp
    // ranks'), next to pcc --explain's prediction.
    std::vector<double> peaks(static_cast<size_t>(ranks.world->size()), 0.0),
        all(peaks.size(), 0.0);
    peaks[static_cast<size_t>(ranks.worldRank)] =
        static_cast<double>(device.peakBytes());
    Status gathered = ranks.world->allReduce(peaks.data(), all.data(),
                                             static_cast<int64_t>(peaks.size()),
                                             DType::F64, ReduceOp::Sum);
    if (!gathered.ok())
      fail("gathering the ranks' high-water marks: " + gathered.error());
    std::vector<double> perStage(static_cast<size_t>(info.num_pipeline_ranks),
                                 0.0);
    for (size_t w = 0; w < all.size(); ++w) {
      // The pipeline coordinate of world rank w (the last axis fastest).
      int64_t rest = static_cast<int64_t>(w), coord = 0;
      for (int a = info.num_mesh_axes - 1; a >= 0; --a) {
        if (a == info.pipeline_axis)
          coord = rest % info.mesh_sizes[a];
        rest /= info.mesh_sizes[a];
      }
      double &peak = perStage[static_cast<size_t>(coord)];
      peak = std::max(peak, all[w]);
    }
    std::string list;
    for (size_t r = 0; r < perStage.size(); ++r) {
      char text[32];
      std::snprintf(text, sizeof(text), "%s%.3f", r ? ", " : "",
                    perStage[r] / 1048576.0);
      list += text;
    }
    std::printf("memory high-water per pipeline rank: %s MiB (pcc --explain "
                "predicts them)\n",
                list.c_str());
  }
  auto slots = trainer.stashSlotsPerRank();
  if (!slots.ok())
    fail(slots.error());
  std::string list;
  for (size_t r = 0; r < slots->size(); ++r)
    list += (r ? ", " : "") + std::to_string((*slots)[r]);
  std::printf("pipeline stash: %s micro-batches in flight at most on "
              "pipeline ranks 0 to %d (%s schedule, %d micro-batches, %d "
              "stages)\n",
              list.c_str(), info.num_pipeline_ranks - 1, info.schedule_policy,
              info.microbatches, info.num_stages);
  if (!o.trace.empty() || !o.traceSvg.empty()) {
    auto all = ranks.world
                   ? pccrun::gatherEvents(*ranks.world, trainer.trace())
                   : Result<std::vector<std::vector<TraceEvent>>>(
                         std::vector<std::vector<TraceEvent>>{trainer.trace()});
    if (!all.ok())
      fail(all.error());
    if (ranks.leader) {
      std::vector<pccrun::RankTrace> rows =
          pccrun::timelineRows(library, all.take());
      std::string model = info.source;
      model = model.substr(model.find_last_of('/') + 1);
      pccrun::TraceInfo ti{model,
                           info.schedule_policy,
                           info.num_pipeline_ranks,
                           info.microbatches,
                           library.chunksPerPipelineRank(),
                           &info};
      std::printf("the last step's pipeline (F, B and W of every "
                  "micro-batch):\n");
      Status s = pccrun::reportTimeline(ti, rows, !device.isHost(), o.trace,
                                        o.traceSvg);
      if (!s.ok())
        fail(s.error());
    }
  }
}

/// Writes --loss-svg: the whole curve of --loss-log when it holds earlier
/// steps of a resumed run, else this run's `curve`.
void writeLossCurve(const TrainOptions &o,
                    const std::vector<std::pair<int64_t, double>> &curve,
                    const std::string &title) {
  // The whole curve when the log holds earlier steps of a resumed run.
  std::vector<std::pair<int64_t, double>> points;
  if (!o.lossLog.empty()) {
    std::ifstream in(o.lossLog);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      long long step = 0;
      double value = 0;
      if (std::sscanf(line.c_str(), "%lld,%lf", &step, &value) == 2)
        points.push_back({step, value});
    }
  }
  if (points.empty())
    points = curve;
  writeSvg(o.lossSvg, points, title);
  std::printf("wrote %s\n", o.lossSvg.c_str());
}

/// Fills one rank's micro-batches of step `k` from `source` into
/// `buffers` (rank `dpRank` of `dp` takes global micro-batch j dp + dpRank
/// as its j-th) and points `microbatches` at them; returns what the loss of
/// this rank's rows is normalised by (labelCount).
double fillStep(DataSource &source, const pcc_model_info &info, int64_t k,
                int64_t dp, int64_t dpRank,
                std::vector<std::vector<uint8_t>> &buffers,
                std::vector<std::vector<const void *>> &microbatches) {
  int nin = info.num_inputs;
  double count = 0;
  for (size_t j = 0; j < microbatches.size(); ++j) {
    std::vector<std::vector<uint8_t>> mb(nin);
    for (int i = 0; i < nin; ++i)
      mb[i].swap(buffers[j * nin + i]);
    source.fill(k, static_cast<int64_t>(j) * dp + dpRank, mb);
    for (int i = 0; i < nin; ++i) {
      mb[i].swap(buffers[j * nin + i]);
      microbatches[j].push_back(buffers[j * nin + i].data());
    }
    count += labelCount(info, buffers[j * nin + nin - 1].data());
  }
  return count;
}

/// Fault injection for the watchdog's test: PCC_TEST_STALL_RANK=RANK:STEP
/// stalls that rank before that step's compute, as a hung device or host
/// would.
void stallForTest(int64_t worldRank, int64_t step) {
  if (const char *stall = std::getenv("PCC_TEST_STALL_RANK")) {
    long long r = -1, at = -1;
    if (std::sscanf(stall, "%lld:%lld", &r, &at) == 2 && r == worldRank &&
        at == step)
      std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

/// The progress line of step `s` of `steps`.
void printStep(int64_t s, int64_t steps, double loss, double lr,
               double gradNorm, double samples, int64_t tokens, double ms,
               const LossScaler &scaler) {
  std::printf("step %lld/%lld  loss %.6f  lr %.3g  grad-norm %.4g  "
              "%.0f %s/s  %.2f ms",
              static_cast<long long>(s), static_cast<long long>(steps), loss,
              lr, gradNorm, tokens ? samples * tokens : samples,
              tokens ? "tokens" : "samples", ms);
  if (scaler.on())
    std::printf("  loss-scale %g  skipped %lld", scaler.scale,
                static_cast<long long>(scaler.skipped));
  std::printf("\n");
  std::fflush(stdout);
}

/// What the runtime held on the device at most, by pool (pcc --explain
/// predicts it).
void reportMemory(const Device &device, const Trainer &trainer) {
  std::printf("memory high-water %.3f MiB on %s (model state %.3f, saved "
              "activations %.3f, arena %.3f, inputs and the rest %.3f)\n",
              device.peakBytes() / 1048576.0, device.describe().c_str(),
              trainer.stateBytes() / 1048576.0,
              trainer.activationBytes() / 1048576.0,
              trainer.arenaBytes() / 1048576.0,
              (device.peakBytes() - trainer.stateBytes() -
               trainer.activationBytes() - trainer.arenaBytes()) /
                  1048576.0);
}

} // namespace

bool parseTrainOption(const std::string &a, TrainOptions &o,
                      const std::function<std::string()> &value) {
  if (a == "--steps")
    o.steps = parseCount(a, value());
  else if (a == "--labels")
    o.labels = value();
  else if (a == "--data")
    o.data = value();
  else if (a == "--data-dtype")
    o.dataDtype = value();
  else if (a == "--seq")
    o.seq = parseCount(a, value());
  else if (a == "--lr") {
    o.hyper.lr = parseNumber(a, value());
    o.lrGiven = true;
  } else if (a == "--momentum")
    o.hyper.momentum = parseNumber(a, value());
  else if (a == "--dampening")
    o.hyper.dampening = parseNumber(a, value());
  else if (a == "--nesterov")
    o.hyper.nesterov = true;
  else if (a == "--weight-decay") {
    o.hyper.weightDecay = parseNumber(a, value());
    o.weightDecayGiven = true;
  } else if (a == "--betas") {
    std::string v = value();
    size_t comma = v.find(',');
    if (comma == std::string::npos)
      fail("--betas needs two numbers, b1,b2 (e.g. 0.9,0.95)");
    o.hyper.beta1 = parseNumber(a, v.substr(0, comma));
    o.hyper.beta2 = parseNumber(a, v.substr(comma + 1));
  } else if (a == "--eps")
    o.hyper.eps = parseNumber(a, value());
  else if (a == "--clip-grad-norm")
    o.hyper.maxGradNorm = parseNumber(a, value());
  else if (a == "--warmup")
    o.warmup = parseCount(a, value());
  else if (a == "--schedule-lr")
    o.schedule = value();
  else if (a == "--min-lr")
    o.minLr = parseNumber(a, value());
  else if (a == "--loss-log")
    o.lossLog = value();
  else if (a == "--loss-svg")
    o.lossSvg = value();
  else if (a == "--save-dir")
    o.saveDir = value();
  else if (a == "--save-sharded")
    o.saveSharded = true;
  else if (a == "--save-every")
    o.saveEvery = parseCount(a, value());
  else if (a == "--resume")
    o.resume = value();
  else if (a == "--shuffle")
    o.shuffle = static_cast<uint64_t>(parseCount(a, value()));
  else if (a == "--seed") {
    int64_t seed = parseCount(a, value());
    if (seed >= (int64_t(1) << 53))
      fail("--seed " + std::to_string(seed) + " must be below 2^53");
    o.seed = static_cast<uint64_t>(seed);
  } else if (a == "--log-every")
    o.logEvery = std::max<int64_t>(parseCount(a, value()), 1);
  else
    return false;
  return true;
}

int runTraining(const TrainOptions &given, const ModelLibrary &library,
                Device &device, const std::string &libraryPath,
                const TrainRanks &ranks) {
  TrainOptions o = given;
  failWorld = ranks.world;
  // Data parallelism: every rank trains on its rows; rank 0 speaks.
  int64_t dp = ranks.dataParallel ? ranks.dataParallel->size() : 1;
  int64_t dpRank = ranks.dataParallel ? ranks.dataParallel->rank() : 0;
  if (!ranks.leader)
    (void)!std::freopen("/dev/null", "w", stdout);
  // The sum of `value` over the dp ranks (exact for counts; the loss sums
  // of the ranks in rank order).
  auto sumOverRanks = [&](double value) {
    if (!ranks.dataParallel)
      return value;
    double total = 0;
    Status summed = ranks.dataParallel->allReduce(&value, &total, 1, DType::F64,
                                                  ReduceOp::Sum);
    if (!summed.ok())
      fail(summed.error());
    return total;
  };
  const pcc_model_info &info = library.info();
  // The model's inputs and labels, one micro-batch's shapes (the forward
  // phase's, or a pipelined library's over all its stages).
  struct {
    int num_inputs;
    const pcc_tensor_spec *inputs;
  } fwd{info.num_inputs, info.inputs};
  std::string optimizer = info.optimizer, loss = info.loss;
  checkOptions(o, optimizer);

  // Data: micro-batches of the forward phase's shapes.
  int nin = fwd.num_inputs;
  // One rank's micro-batch has microRows rows; the step's global batch is
  // m micro-batches on each of the dp ranks. Rank r's micro-batch j is the
  // global micro-batch j * dp + r: rows [(j dp + r) microRows, ...) of the
  // step's batch, so the rows of micro-batch j on one device are split
  // over the ranks.
  int64_t microRows = fwd.inputs[0].rank ? fwd.inputs[0].shape[0] : 1;
  int64_t m = std::max<int32_t>(info.microbatches, 1);
  int64_t batch = microRows * m * dp;
  std::unique_ptr<DataSource> source = openData(o, info, microRows, batch);

  auto trainer =
      library.isPipelined()
          ? Trainer::create(library, device, ranks.pipelineRank, ranks.pipeline)
          : Trainer::create(library, device);
  if (!trainer.ok())
    fail(trainer.error());
  trainer->setCommunicators(ranks.comms);
  trainer->setDataParallelRank(dpRank, dp);

  // The run's hyperparameters; a resumed run takes the checkpoint's seed.
  Hyperparameters hyper = o.hyper;
  if (o.seed)
    hyper.seed = *o.seed;

  // Start: the library's weights file, or a checkpoint.
  LossScaler scaler(info);
  int64_t start = loadState(o, *trainer, library, optimizer, hyper, scaler);

  int64_t tp = 1;
  for (int a = 0; a < info.num_mesh_axes; ++a)
    if (std::string(info.mesh_axes[a]) == PCC_MESH_AXIS_TP)
      tp = info.mesh_sizes[a];
  std::string ranksText =
      dp > 1 ? " on each of " + std::to_string(dp) + " data-parallel ranks"
             : "";
  if (tp > 1)
    ranksText += std::string(dp > 1 ? "," : "") + " split over " +
                 std::to_string(tp) + " tensor-parallel ranks";
  if (library.isPipelined())
    ranksText += std::string(dp > 1 || tp > 1 ? "," : "") + " pipelined over " +
                 std::to_string(info.num_pipeline_ranks) + " ranks";
  // The engine where it is not MPI's on CPU ranks (nccl, mpi staged).
  if (ranks.engine && !ranksText.empty() && std::string(ranks.engine) != "mpi")
    ranksText += std::string(" (") + ranks.engine + ")";
  std::printf("training %s on %s: %s, batch %lld (%lld micro-batch%s of "
              "%lld%s), loss %s, %s\n",
              libraryPath.c_str(), device.describe().c_str(),
              source->describe().c_str(), static_cast<long long>(batch),
              static_cast<long long>(m), m == 1 ? "" : "es",
              static_cast<long long>(microRows), ranksText.c_str(),
              loss.c_str(), hyperDescription(o, optimizer.c_str()).c_str());
  std::printf("model state %.2f MiB (%lld bytes), saved activations %.2f "
              "MiB, arena %.2f MiB\n",
              trainer->stateBytes() / 1048576.0,
              static_cast<long long>(trainer->stateBytes()),
              trainer->activationBytes() / 1048576.0,
              trainer->arenaBytes() / 1048576.0);

  // The loss log.
  FILE *log = !o.lossLog.empty() && ranks.leader
                  ? openLossLog(o, start, scaler.on())
                  : nullptr;

  std::vector<std::vector<uint8_t>> buffers(m * nin);
  for (int64_t j = 0; j < m; ++j)
    for (int i = 0; i < nin; ++i)
      buffers[j * nin + i].resize(specBytes(fwd.inputs[i]));
  // Checkpoints (saveCheckpoint).
  RunFacts facts{libraryPath, loss, optimizer, batch, m, dp, tp};
  auto save = [&](int64_t step) {
    saveCheckpoint(o, info, facts, ranks, *trainer, hyper.seed, step, scaler);
  };

  // The bytes the library's collectives move during the steps, over dp and
  // over tp (collectiveTraffic).
  auto traffic = [&](bool overTp) {
    return collectiveTraffic(info, ranks.comms, overTp);
  };
  CommBinding::Traffic stepTraffic, tpTraffic;
  int64_t trafficSteps = 0;

  std::vector<std::pair<int64_t, double>> curve;
  // --profile: every step after the first of this run (or the only one).
  std::unique_ptr<pccrun::Profiler> profiler;
  if (o.profile)
    profiler = pccrun::startProfiling(device);
  auto begin = std::chrono::steady_clock::now();
  double lastLoss = NAN;
  for (int64_t s = start + 1; s <= o.steps; ++s) {
    int64_t k = s - 1;
    std::vector<std::vector<const void *>> microbatches(m);
    double count =
        fillStep(*source, info, k, dp, dpRank, buffers, microbatches);
    // The normaliser counts the labels of every rank's rows.
    count = sumOverRanks(count);
    double lr = learningRate(o, s);
    stallForTest(ranks.worldRank, s);
    bool traceStep = s == o.steps && (!o.trace.empty() || !o.traceSvg.empty());
    if (traceStep) {
      // Every rank's clock starts as it leaves one barrier.
      if (ranks.world) {
        Status met = ranks.world->barrier();
        if (!met.ok())
          fail("the barrier before the traced step: " + met.error());
      }
      trainer->traceNextStep(
          std::chrono::duration<double>(
              std::chrono::steady_clock::now().time_since_epoch())
              .count());
    }
    auto t0 = std::chrono::steady_clock::now();
    CommBinding::Traffic before = traffic(false), tpBefore = traffic(true);
    // fp16: the scaled loss's gradient; the optimizer counts the steps it
    // took (AdamW's bias correction), not those skipped for an overflow.
    double scale = scaler.on() ? scaler.scale : 1.0;
    hyper.lossScale = scaler.on() ? scaler.scale : 0.0;
    bool profiled = profiler && (s > start + 1 || o.steps == start + 1);
    if (profiled)
      profiler->beginRun();
    auto result = trainer->step(microbatches, count > 0 ? scale / count : 0.0,
                                hyper.table(s - scaler.skipped, lr));
    if (profiled)
      profiler->endRun();
    if (!result.ok())
      fail("step " + std::to_string(s) + ": " + result.error());
    addTraffic(stepTraffic, before, traffic(false));
    addTraffic(tpTraffic, tpBefore, traffic(true));
    ++trafficSteps;
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    if (count == 0)
      std::fprintf(stderr,
                   "pcc-run: warning: step %lld: every label is the ignored "
                   "%lld; the step changes nothing but weight decay\n",
                   static_cast<long long>(s),
                   static_cast<long long>(info.ignore_index));
    double stepLoss = count > 0 ? sumOverRanks(result->lossSum) / count : NAN;
    lastLoss = stepLoss;
    curve.push_back({s, stepLoss});
    double samples = batch / (ms / 1000.0);
    // Every rank sees the same global norm, so all of them skip together.
    bool overflow = scaler.on() && !std::isfinite(result->gradNorm);
    // A norm is not negative; an overflow's NaN prints as "nan", not "-nan".
    double gradNorm = std::fabs(result->gradNorm / scale);
    if (overflow) {
      std::printf("step %lld: gradients overflowed at loss scale %g; step "
                  "skipped%s\n",
                  static_cast<long long>(s), scale,
                  scaler.window > 0 ? ", scale halved" : "");
      if (scaler.overflowsInARow + 1 >= 50)
        fail("step " + std::to_string(s) +
             ": 50 steps in a row overflowed in fp16 (loss scale now " +
             std::to_string(scale) +
             "): the model diverged; lower --lr or train in bf16");
    }
    scaler.update(overflow);
    if (!std::isfinite(stepLoss) && count > 0 && !overflow)
      fail("step " + std::to_string(s) + ": the loss is " +
           std::to_string(stepLoss) +
           " (diverged; lower --lr or add "
           "--clip-grad-norm)");
    if (log) {
      std::fprintf(log, "%lld,%.9g,%.9g,%.9g,%.6g,%.4g",
                   static_cast<long long>(s), stepLoss, lr, gradNorm, samples,
                   ms);
      if (scaler.on())
        std::fprintf(log, ",%.9g", scale);
      std::fputc('\n', log);
      std::fflush(log);
    }
    if (s % o.logEvery == 0 || s == o.steps || s == start + 1)
      printStep(s, o.steps, stepLoss, lr, gradNorm, samples,
                source->tokensPerSample(), ms, scaler);
    if (!o.saveDir.empty() && o.saveEvery > 0 && s % o.saveEvery == 0)
      save(s);
  }
  if (!o.saveDir.empty() && (o.saveEvery == 0 || o.steps % o.saveEvery != 0))
    save(o.steps);
  if (log)
    std::fclose(log);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin)
          .count();
  std::printf("trained steps %lld to %lld in %.2f s; last loss %.6f\n",
              static_cast<long long>(start + 1),
              static_cast<long long>(o.steps), seconds, lastLoss);
  if (scaler.on())
    std::printf("fp16 loss scaling: %lld step%s skipped for overflowed "
                "gradients; loss scale now %g\n",
                static_cast<long long>(scaler.skipped),
                scaler.skipped == 1 ? "" : "s", scaler.scale);
  reportMemory(device, *trainer);
  if (library.isPipelined())
    reportPipeline(o, library, device, ranks, *trainer);
  if (trainer->hostStateBytes() > 0)
    std::printf("offloaded optimizer: %.3f MiB of state in host memory "
                "(optimizer state, and host copies of the gradients and "
                "weights the update reads)\n",
                trainer->hostStateBytes() / 1048576.0);
  if (ranks.comms && trafficSteps > 0)
    reportCommunication(info, *trainer, tpTraffic, stepTraffic, trafficSteps);
  if (!o.lossSvg.empty() && ranks.leader)
    writeLossCurve(o, curve, "training loss (" + loss + ", " + optimizer + ")");
  if (profiler) {
    Status s = pccrun::finishProfiling(*profiler, device, ranks.world,
                                       "training steps", o.profileTrace);
    if (!s.ok())
      fail("--profile: " + s.error());
  }
  return 0;
}

} // namespace pccrt
