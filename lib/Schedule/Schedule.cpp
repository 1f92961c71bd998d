//===- Schedule.cpp - pipeline micro-batch schedules ----------------------===//
//
// Generation builds each rank's order of compute (F, B, W) from the
// policy, then inserts the transfers around it: a receive before F (B)
// when the previous (next) virtual stage produced its input, a send after.
// Interleaved training lists then move their transfers between units of
// compute (Megatron-LM's exchange), so that they run as NCCL groups.
// ZB-H1's W positions come from replaying the 1F1B order with unit
// durations and running a pending W whenever the rank would otherwise
// wait. `simulate` is the same replay over a finished list.
//
//===----------------------------------------------------------------------===//

#include "pcc/Schedule/Schedule.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

namespace pcc::schedule {

const char *policyName(Policy policy) {
  switch (policy) {
  case Policy::GPipe:
    return "gpipe";
  case Policy::OneFOneB:
    return "1f1b";
  case Policy::Interleaved:
    return "interleaved";
  case Policy::ZeroBubbleH1:
    return "zb-h1";
  }
  return "?";
}

std::optional<Policy> parsePolicy(const std::string &name) {
  for (Policy p : {Policy::GPipe, Policy::OneFOneB, Policy::Interleaved,
                   Policy::ZeroBubbleH1})
    if (name == policyName(p))
      return p;
  return std::nullopt;
}

const char *opName(Op op) {
  switch (op) {
  case Op::Forward:
    return "F";
  case Op::Backward:
    return "B";
  case Op::WeightGrad:
    return "W";
  case Op::SendForward:
    return "send_fwd";
  case Op::RecvForward:
    return "recv_fwd";
  case Op::SendBackward:
    return "send_bwd";
  case Op::RecvBackward:
    return "recv_bwd";
  }
  return "?";
}

static bool isCompute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::WeightGrad;
}

static std::string describeInstr(const Instr &i, int32_t chunks) {
  std::ostringstream os;
  os << opName(i.op) << i.microbatch;
  if (chunks > 1)
    os << "." << i.chunk;
  if (i.peer >= 0)
    os << (i.op == Op::SendForward || i.op == Op::SendBackward ? ">" : "<")
       << i.peer;
  return os.str();
}

std::optional<Instr> parseInstr(const std::string &text) {
  for (Op op : {Op::SendForward, Op::RecvForward, Op::SendBackward,
                Op::RecvBackward, Op::Forward, Op::Backward, Op::WeightGrad}) {
    std::string name = opName(op);
    if (text.compare(0, name.size(), name) != 0)
      continue;
    Instr instr{op, 0, 0, -1};
    size_t pos = name.size();
    // Reads a non-negative decimal number at pos.
    auto number = [&](int32_t &out) {
      size_t start = pos;
      int64_t value = 0;
      while (pos < text.size() &&
             std::isdigit(static_cast<unsigned char>(text[pos])) &&
             value < (1 << 30))
        value = value * 10 + (text[pos++] - '0');
      out = static_cast<int32_t>(value);
      return pos > start;
    };
    if (!number(instr.microbatch))
      return std::nullopt;
    if (pos < text.size() && text[pos] == '.') {
      ++pos;
      if (!number(instr.chunk))
        return std::nullopt;
    }
    bool isSend = op == Op::SendForward || op == Op::SendBackward;
    if (!isCompute(op)) {
      if (pos >= text.size() || text[pos] != (isSend ? '>' : '<'))
        return std::nullopt;
      ++pos;
      if (!number(instr.peer))
        return std::nullopt;
    }
    if (pos != text.size())
      return std::nullopt;
    return instr;
  }
  return std::nullopt;
}

std::string Schedule::describeRank(size_t r) const {
  std::string line;
  for (const Instr &i : ranks[r])
    line += (line.empty() ? "" : " ") + describeInstr(i, options.chunks);
  return line;
}

std::string Schedule::describe() const {
  std::string text;
  for (size_t r = 0; r < ranks.size(); ++r)
    text += "rank " + std::to_string(r) + ": " + describeRank(r) + "\n";
  return text;
}

double Simulation::meanBubbleFraction() const {
  if (bubbleFraction.empty())
    return 0;
  double sum = 0;
  for (double b : bubbleFraction)
    sum += b;
  return sum / bubbleFraction.size();
}

double Simulation::busiestBubbleFraction() const {
  return bubbleFraction.empty()
             ? 0
             : *std::min_element(bubbleFraction.begin(), bubbleFraction.end());
}

double analyticBubbleFraction(const Options &o) {
  double p = o.stages, m = o.microbatches;
  double v = o.policy == Policy::Interleaved ? o.chunks : 1;
  return (p - 1) / (v * m + p - 1);
}

namespace {

//===----------------------------------------------------------------------===//
// Replay
//===----------------------------------------------------------------------===//

/// Identifies a piece of work or a transfer: (op, micro-batch, virtual
/// stage). A transfer is keyed by the virtual stage that receives it.
using Key = std::tuple<int, int32_t, int32_t>;

class Replay {
public:
  Replay(const Options &o, const Durations &d,
         std::vector<std::vector<Instr>> lists, bool implicitTransfers,
         bool flexibleWeightGrads)
      : o(o), d(d), lists(std::move(lists)), implicit(implicitTransfers),
        flexible(flexibleWeightGrads), p(o.stages), V(o.stages * o.chunks) {}

  /// Runs to the end; on success `order` holds what each rank ran.
  std::string run();

  std::vector<std::vector<Instr>> order;
  Simulation sim;
  std::string checkGroups() const;

private:
  int32_t vstage(int32_t rank, int32_t chunk) const {
    return virtualStage(p, rank, chunk);
  }
  double duration(Op op, int32_t vs) const {
    auto of = [&](const std::vector<double> &perStage, double all) {
      return vs < static_cast<int32_t>(perStage.size()) ? perStage[vs] : all;
    };
    switch (op) {
    case Op::Forward:
      return of(d.forwardOf, d.forward);
    case Op::Backward:
      return of(d.backwardOf, d.backward);
    case Op::WeightGrad:
      return of(d.weightGradOf, d.weightGrad);
    default:
      return 0;
    }
  }
  /// When `i` on `rank` may start as far as its dependencies go; nullopt
  /// while one of them has not run. Sets `error` for one that can never run
  /// (same-rank work that should have come first).
  std::optional<double> ready(int32_t rank, const Instr &i,
                              std::string &error) const;
  /// Where (op, mb, vs) finishes in `finished`, or -1 outside the
  /// schedule's micro-batches and virtual stages.
  int64_t slot(Op op, int32_t mb, int32_t vs) const {
    if (mb < 0 || mb >= o.microbatches || vs < 0 || vs >= V)
      return -1;
    return (static_cast<int64_t>(op) * V + vs) * o.microbatches + mb;
  }
  std::optional<double> done(Op op, int32_t mb, int32_t vs) const {
    int64_t at = slot(op, mb, vs);
    if (at < 0 || finished[at] < 0)
      return std::nullopt;
    return finished[at];
  }
  /// When what `op` of virtual stage `vs` sends has arrived.
  std::optional<double> arrival(Op op, int32_t mb, int32_t vs) const {
    auto t = done(op, mb, vs);
    return t ? std::optional<double>(*t + d.transfer) : std::nullopt;
  }
  void execute(int32_t rank, const Instr &i, double start);
  std::string checkChannels() const;

  const Options &o;
  Durations d;
  std::vector<std::vector<Instr>> lists;
  bool implicit, flexible;
  int32_t p, V;
  /// When each (op, micro-batch, virtual stage) finished; -1: not yet.
  std::vector<double> finished;
  std::vector<double> freeAt;
  std::vector<std::deque<Instr>> pendingW;
  std::vector<int32_t> inFlight;
};

std::optional<double> Replay::ready(int32_t rank, const Instr &i,
                                    std::string &error) const {
  int32_t vs = vstage(rank, i.chunk), mb = i.microbatch;
  auto sameRank = [&](Op op, int32_t stage) -> std::optional<double> {
    auto t = done(op, mb, stage);
    if (!t)
      error = "rank " + std::to_string(rank) + " runs " +
              describeInstr(i, o.chunks) + " before " + opName(op) +
              std::to_string(mb) + " of virtual stage " +
              std::to_string(stage) + ", which it needs";
    return t;
  };
  switch (i.op) {
  case Op::Forward:
    if (vs == 0)
      return 0.0;
    // With explicit transfers the receive must have been posted on this
    // rank; either way the data is there a transfer after its send.
    if (!implicit && !sameRank(Op::RecvForward, vs))
      return std::nullopt;
    return arrival(implicit ? Op::Forward : Op::SendForward, mb, vs - 1);
  case Op::Backward: {
    auto f = sameRank(Op::Forward, vs);
    if (!f)
      return std::nullopt;
    if (vs == V - 1)
      return f;
    if (!implicit && !sameRank(Op::RecvBackward, vs))
      return std::nullopt;
    auto g = arrival(implicit ? Op::Backward : Op::SendBackward, mb, vs + 1);
    if (!g)
      return std::nullopt;
    return std::max(*f, *g);
  }
  case Op::WeightGrad:
    return sameRank(Op::Backward, vs);
  case Op::SendForward:
    return sameRank(Op::Forward, vs);
  case Op::SendBackward:
    return sameRank(Op::Backward, vs);
  case Op::RecvForward:
  case Op::RecvBackward:
    // A receive is posted: it waits for nothing, and the compute that
    // reads it waits for the data.
    return 0.0;
  }
  return std::nullopt;
}

void Replay::execute(int32_t rank, const Instr &i, double start) {
  int32_t vs = vstage(rank, i.chunk);
  double end = start + duration(i.op, vs);
  if (int64_t at = slot(i.op, i.microbatch, vs); at >= 0)
    finished[at] = end;
  freeAt[rank] = end;
  order[rank].push_back(i);
  if (isCompute(i.op))
    sim.timeline[rank].push_back({i, start, end});
  if (i.op == Op::Forward) {
    ++inFlight[rank];
    sim.peakInFlight[rank] = std::max(sim.peakInFlight[rank], inFlight[rank]);
    if (o.forwardOnly)
      --inFlight[rank];
  } else if (i.op == Op::Backward) {
    --inFlight[rank];
    if (flexible)
      pendingW[rank].push_back({Op::WeightGrad, i.microbatch, i.chunk});
  }
}

std::string Replay::run() {
  order.assign(p, {});
  sim.timeline.assign(p, {});
  sim.peakInFlight.assign(p, 0);
  freeAt.assign(p, 0);
  pendingW.assign(p, {});
  inFlight.assign(p, 0);
  std::vector<size_t> next(p, 0);
  finished.assign(static_cast<size_t>(7) * V * std::max(0, o.microbatches),
                  -1.0);
  // Ranks by the time they are free, ties by rank: decisions are made in
  // time order, so a rank that finds its next work not ready is really
  // idle then. Only the rank that ran moves (later: its time only grows).
  std::vector<int32_t> byTime(p);
  for (int32_t r = 0; r < p; ++r)
    byTime[r] = r;
  auto moveLater = [&](int32_t rank) {
    size_t at = std::find(byTime.begin(), byTime.end(), rank) - byTime.begin();
    auto before = [&](int32_t a, int32_t b) {
      return freeAt[a] < freeAt[b] || (freeAt[a] == freeAt[b] && a < b);
    };
    while (at + 1 < byTime.size() && before(byTime[at + 1], rank)) {
      byTime[at] = byTime[at + 1];
      ++at;
    }
    byTime[at] = rank;
  };
  // A rank whose next work waits on another rank stays blocked until a
  // neighbour (which owns the virtual stages next to its own) runs
  // something: the scan skips it without asking again.
  std::vector<char> blocked(p, 0);
  auto ran = [&](int32_t rank) {
    blocked[rank] = 0;
    blocked[(rank + 1) % p] = 0;
    blocked[(rank + p - 1) % p] = 0;
  };
  for (;;) {
    bool progressed = false, finishedAll = true;
    std::string error;
    for (int32_t r : byTime) {
      bool fixedLeft = next[r] < lists[r].size();
      if (!fixedLeft && pendingW[r].empty())
        continue;
      finishedAll = false;
      if (blocked[r])
        continue;
      std::optional<double> at;
      if (fixedLeft) {
        at = ready(r, lists[r][next[r]], error);
        if (!error.empty())
          return error;
      }
      // ZB-H1: a pending W runs when the rank would wait, when there is no
      // other work left, or when r of them are held already. Rank r holds at
      // most p - r micro-batches' activations in 1F1B, so deferring r
      // weight gradients keeps every rank within the first rank's peak of p;
      // the last ranks, which finish their backward passes first, defer
      // most and fill the drain with them.
      if (flexible && !pendingW[r].empty() &&
          (!fixedLeft || !at || *at > freeAt[r] ||
           static_cast<int32_t>(pendingW[r].size()) > r)) {
        Instr w = pendingW[r].front();
        pendingW[r].pop_front();
        execute(r, w, freeAt[r]);
        moveLater(r);
        ran(r);
        progressed = true;
        break;
      }
      if (!at) {
        blocked[r] = 1;
        continue;
      }
      execute(r, lists[r][next[r]], std::max(*at, freeAt[r]));
      moveLater(r);
      ran(r);
      ++next[r];
      progressed = true;
      break;
    }
    if (finishedAll)
      break;
    if (!progressed) {
      std::ostringstream os;
      os << "deadlock:";
      for (int32_t r = 0; r < p; ++r)
        if (next[r] < lists[r].size())
          os << " rank " << r << " waits at "
             << describeInstr(lists[r][next[r]], o.chunks) << ";";
      std::string s = os.str();
      s.pop_back();
      return s;
    }
  }
  // Every piece of work once, on the rank that owns its virtual stage;
  // every transfer received.
  std::vector<int> count(finished.size(), 0);
  for (int32_t r = 0; r < p; ++r)
    for (const Instr &i : order[r])
      if (int64_t at = slot(i.op, i.microbatch, vstage(r, i.chunk)); at >= 0)
        ++count[at];
  for (int32_t vs = 0; vs < V; ++vs)
    for (int32_t mb = 0; mb < o.microbatches; ++mb)
      for (Op op : {Op::Forward, Op::Backward, Op::WeightGrad}) {
        if (o.forwardOnly && op != Op::Forward)
          continue;
        int n = count[slot(op, mb, vs)];
        if (n != 1)
          return std::string(opName(op)) + " of micro-batch " +
                 std::to_string(mb) + " on virtual stage " +
                 std::to_string(vs) + " runs " + std::to_string(n) +
                 " times, not once";
      }
  if (!implicit)
    for (int32_t vs = 0; vs < V; ++vs)
      for (int32_t mb = 0; mb < o.microbatches; ++mb)
        for (Op sent : {Op::SendForward, Op::SendBackward}) {
          if (!count[slot(sent, mb, vs)])
            continue;
          Op recv =
              sent == Op::SendForward ? Op::RecvForward : Op::RecvBackward;
          int32_t to = sent == Op::SendForward ? vs + 1 : vs - 1;
          int64_t received = slot(recv, mb, to);
          if (received < 0 || !count[received])
            return std::string(opName(sent)) + " of micro-batch " +
                   std::to_string(mb) + " from virtual stage " +
                   std::to_string(vs) + " is never received";
        }
  if (!implicit) {
    std::string error = checkChannels();
    if (!error.empty())
      return error;
  }
  sim.makespan = 0;
  for (double t : freeAt)
    sim.makespan = std::max(sim.makespan, t);
  sim.bubbleFraction.assign(p, 0);
  for (int32_t r = 0; r < p; ++r) {
    double busy = 0;
    for (const Interval &i : sim.timeline[r])
      busy += i.end - i.start;
    sim.bubbleFraction[r] = sim.makespan > 0 ? 1 - busy / sim.makespan : 0;
  }
  return "";
}

/// NCCL and MPI (pcc uses one tag) match the messages between two ranks in
/// the order they were posted, so each rank's sends to a peer must come in
/// the order that peer receives them. Messages are told apart by (send op,
/// micro-batch, virtual stage receiving).
std::string Replay::checkChannels() const {
  using Message = std::tuple<int, int32_t, int32_t>;
  std::map<std::pair<int32_t, int32_t>, std::vector<Message>> sent, received;
  for (int32_t r = 0; r < p; ++r)
    for (const Instr &i : lists[r]) {
      int32_t vs = vstage(r, i.chunk);
      switch (i.op) {
      case Op::SendForward:
      case Op::SendBackward:
        sent[{r, i.peer}].push_back(
            {static_cast<int>(i.op), i.microbatch,
             i.op == Op::SendForward ? vs + 1 : vs - 1});
        break;
      case Op::RecvForward:
      case Op::RecvBackward:
        received[{i.peer, r}].push_back(
            {static_cast<int>(i.op == Op::RecvForward ? Op::SendForward
                                                      : Op::SendBackward),
             i.microbatch, vs});
        break;
      default:
        break;
      }
    }
  auto describe = [](const Message &msg) {
    auto [op, mb, vs] = msg;
    return std::string(opName(static_cast<Op>(op))) + " of micro-batch " +
           std::to_string(mb) + " to virtual stage " + std::to_string(vs);
  };
  for (auto &[channel, messages] : sent) {
    const std::vector<Message> &expected = received[channel];
    auto [from, to] = channel;
    for (size_t n = 0; n < std::max(messages.size(), expected.size()); ++n) {
      if (n < messages.size() && n < expected.size() &&
          messages[n] == expected[n])
        continue;
      std::string what = "message " + std::to_string(n) + " from rank " +
                         std::to_string(from) + " to rank " +
                         std::to_string(to) + " is ";
      what += n < messages.size() ? describe(messages[n]) : "never sent";
      what += ", but rank " + std::to_string(to) + " receives ";
      what += n < expected.size() ? describe(expected[n]) : "nothing more";
      return what + " there (messages between two ranks pair up in order)";
    }
  }
  for (auto &[channel, messages] : received)
    if (!sent.count(channel) && !messages.empty())
      return "rank " + std::to_string(channel.second) + " receives " +
             describe(messages[0]) + " from rank " +
             std::to_string(channel.first) + ", which sends it nothing";
  return "";
}

/// See checkGroupedTransfers. Each rank has two queues, as on a GPU: its
/// computes run in list order, each once the groups holding its receives
/// have completed; its groups run in list order too, each entered once the
/// computes before it in the list are done (its sends read them) and the
/// group before it has completed, and completed once every send and
/// receive in it has its partner in a group the peer has entered.
std::string Replay::checkGroups() const {
  // Per rank, its groups as [begin, end) ranges of its list, how many
  // computes come before each, and for each transfer the (peer rank, peer
  // group) holding its partner. A transfer is the n-th message of its
  // channel (sender, receiver) on its side.
  struct Group {
    size_t begin, end;
    size_t computesBefore;
    std::vector<std::pair<int32_t, size_t>> partners;
  };
  struct Compute {
    size_t at;         // index in the list
    size_t needsGroup; // 1 + the last group holding its receives (0: none)
  };
  using Message = std::tuple<int32_t, int32_t, size_t, bool>;
  std::vector<std::vector<Group>> groups(p);
  std::vector<std::vector<Compute>> computes(p);
  std::map<std::pair<int32_t, int32_t>, size_t> sentCount, receivedCount;
  std::map<Message, size_t> groupOf;
  std::vector<std::pair<int32_t, Message>> transfers; // (rank, message)
  for (int32_t r = 0; r < p; ++r) {
    const std::vector<Instr> &list = lists[r];
    // The group each (compute op, micro-batch, chunk) receives in.
    std::map<std::tuple<int, int32_t, int32_t>, size_t> receivedIn;
    for (size_t i = 0; i < list.size();) {
      if (isCompute(list[i].op)) {
        auto it = receivedIn.find(
            {static_cast<int>(list[i].op), list[i].microbatch, list[i].chunk});
        computes[r].push_back(
            {i, it == receivedIn.end() ? 0 : it->second + 1});
        ++i;
        continue;
      }
      Group g{i, i, computes[r].size(), {}};
      for (; g.end < list.size() && !isCompute(list[g.end].op); ++g.end) {
        const Instr &t = list[g.end];
        bool isSend = t.op == Op::SendForward || t.op == Op::SendBackward;
        if (!isSend)
          receivedIn[{static_cast<int>(t.op == Op::RecvForward ? Op::Forward
                                                               : Op::Backward),
                      t.microbatch, t.chunk}] = groups[r].size();
        std::pair<int32_t, int32_t> channel =
            isSend ? std::pair{r, t.peer} : std::pair{t.peer, r};
        size_t n = isSend ? sentCount[channel]++ : receivedCount[channel]++;
        Message m{channel.first, channel.second, n, isSend};
        groupOf[m] = groups[r].size();
        transfers.push_back({r, m});
      }
      i = g.end;
      groups[r].push_back(std::move(g));
    }
  }
  for (auto &[r, m] : transfers) {
    auto [from, to, n, isSend] = m;
    int32_t peer = isSend ? to : from;
    auto partner = groupOf.find({from, to, n, !isSend});
    if (partner == groupOf.end())
      return "rank " + std::to_string(r) + "'s message " + std::to_string(n) +
             (isSend ? " to" : " from") + " rank " + std::to_string(peer) +
             " has no partner";
    // A rank's transfers to itself (one pipeline rank, interleaved) are
    // local copies, which wait for nothing.
    if (peer != r)
      groups[r][groupOf[m]].partners.push_back({peer, partner->second});
  }
  // Replay: completed[r] groups and ran[r] computes of rank r are done.
  std::vector<size_t> completed(p, 0), ran(p, 0);
  auto entered = [&](int32_t r, size_t g) {
    return g < completed[r] ||
           (g == completed[r] && g < groups[r].size() &&
            groups[r][g].computesBefore <= ran[r]);
  };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int32_t r = 0; r < p; ++r) {
      if (ran[r] < computes[r].size() &&
          computes[r][ran[r]].needsGroup <= completed[r]) {
        ++ran[r];
        progressed = true;
      }
      if (completed[r] >= groups[r].size() || !entered(r, completed[r]))
        continue;
      const Group &g = groups[r][completed[r]];
      if (std::all_of(g.partners.begin(), g.partners.end(),
                      [&](const auto &partner) {
                        return entered(partner.first, partner.second);
                      })) {
        ++completed[r];
        progressed = true;
      }
    }
  }
  std::string stuck;
  for (int32_t r = 0; r < p; ++r) {
    if (completed[r] < groups[r].size() && entered(r, completed[r])) {
      const Group &g = groups[r][completed[r]];
      stuck += " rank " + std::to_string(r) + " waits in {";
      for (size_t i = g.begin; i < g.end; ++i)
        stuck +=
            (i == g.begin ? "" : " ") + describeInstr(lists[r][i], o.chunks);
      stuck += "};";
    } else if (ran[r] < computes[r].size()) {
      stuck += " rank " + std::to_string(r) + " waits at " +
               describeInstr(lists[r][computes[r][ran[r]].at], o.chunks) + ";";
    }
  }
  if (stuck.empty())
    return "";
  stuck.pop_back();
  return "deadlock with the transfers between two computes grouped (as NCCL "
         "runs them):" +
         stuck;
}

//===----------------------------------------------------------------------===//
// Compute orders
//===----------------------------------------------------------------------===//

using Order = std::vector<Instr>;

void addBackward(Order &out, const Options &o, int32_t mb, int32_t chunk,
                 bool withW) {
  if (o.forwardOnly)
    return;
  out.push_back({Op::Backward, mb, chunk});
  if (withW)
    out.push_back({Op::WeightGrad, mb, chunk});
}

Order gpipe(const Options &o, int32_t) {
  Order out;
  for (int32_t mb = 0; mb < o.microbatches; ++mb)
    out.push_back({Op::Forward, mb, 0});
  for (int32_t mb = 0; mb < o.microbatches; ++mb)
    addBackward(out, o, mb, 0, /*withW=*/true);
  return out;
}

Order oneFOneB(const Options &o, int32_t rank, bool withW) {
  int32_t m = o.microbatches;
  if (o.forwardOnly)
    return gpipe(o, rank);
  int32_t warmup = std::min(o.stages - rank - 1, m);
  Order out;
  for (int32_t mb = 0; mb < warmup; ++mb)
    out.push_back({Op::Forward, mb, 0});
  for (int32_t i = 0; i < m - warmup; ++i) {
    out.push_back({Op::Forward, warmup + i, 0});
    addBackward(out, o, i, 0, withW);
  }
  for (int32_t i = m - warmup; i < m; ++i)
    addBackward(out, o, i, 0, withW);
  return out;
}

/// The forwards rank `rank` runs before its first backward in the
/// interleaved order (all of them when that is fewer).
int32_t interleavedWarmup(const Options &o, int32_t rank) {
  int32_t p = o.stages, v = o.chunks, total = o.microbatches * v;
  return std::min((p - rank - 1) * 2 + (v - 1) * p, total);
}

/// Megatron-LM's interleaved order: micro-batches in groups of p, each
/// group through every chunk before the next group starts.
Order interleaved(const Options &o, int32_t rank) {
  int32_t p = o.stages, v = o.chunks, total = o.microbatches * v;
  auto unit = [&](int32_t k, bool forward) {
    int32_t chunk = (k % (p * v)) / p;
    if (!forward)
      chunk = v - 1 - chunk;
    int32_t mb = (k / (p * v)) * p + k % p;
    return std::make_pair(mb, chunk);
  };
  Order out;
  if (o.forwardOnly) {
    for (int32_t k = 0; k < total; ++k) {
      auto [mb, c] = unit(k, true);
      out.push_back({Op::Forward, mb, c});
    }
    return out;
  }
  int32_t warmup = interleavedWarmup(o, rank);
  for (int32_t k = 0; k < warmup; ++k) {
    auto [mb, c] = unit(k, true);
    out.push_back({Op::Forward, mb, c});
  }
  for (int32_t i = 0; i < total - warmup; ++i) {
    auto [fm, fc] = unit(warmup + i, true);
    out.push_back({Op::Forward, fm, fc});
    auto [bm, bc] = unit(i, false);
    addBackward(out, o, bm, bc, /*withW=*/true);
  }
  for (int32_t i = total - warmup; i < total; ++i) {
    auto [bm, bc] = unit(i, false);
    addBackward(out, o, bm, bc, /*withW=*/true);
  }
  return out;
}

/// Adds the transfers around each rank's compute.
std::vector<Order> withTransfers(const Options &o,
                                 const std::vector<Order> &compute) {
  int32_t p = o.stages, V = o.stages * o.chunks;
  std::vector<Order> out(p);
  for (int32_t r = 0; r < p; ++r) {
    for (const Instr &i : compute[r]) {
      int32_t vs = virtualStage(p, r, i.chunk);
      if (i.op == Op::Forward && vs > 0)
        out[r].push_back(
            {Op::RecvForward, i.microbatch, i.chunk, (vs - 1) % p});
      if (i.op == Op::Backward && vs < V - 1)
        out[r].push_back(
            {Op::RecvBackward, i.microbatch, i.chunk, (vs + 1) % p});
      out[r].push_back(i);
      if (i.op == Op::Forward && vs < V - 1)
        out[r].push_back(
            {Op::SendForward, i.microbatch, i.chunk, (vs + 1) % p});
      if (i.op == Op::Backward && vs > 0)
        out[r].push_back(
            {Op::SendBackward, i.microbatch, i.chunk, (vs - 1) % p});
    }
  }
  return out;
}

/// Megatron-LM's exchange for interleaved training. The forwards and
/// backwards run in units: a warm-up F; in the steady state an F with the
/// B after it; a cool-down B. All transfers sit between units, each
/// unit's sends with the next unit's receives, as one group. So a steady
/// B's gradient is received before the F that shares its unit (posted a
/// compute early), and that F's activations leave after the B. A W runs
/// right after the group that follows its B, so the B's send does not
/// wait for it. Every interleaved training list then passes
/// checkGroupedTransfers (the unit tests try p up to 8, m up to 16, v up
/// to 3), where receives right before their computes deadlock.
void exchangeBetweenUnits(const Options &o, std::vector<Order> &lists) {
  int32_t total = o.microbatches * o.chunks;
  for (int32_t r = 0; r < o.stages; ++r) {
    Order &list = lists[r];
    // Units of F and B, in order, the first total - warmup backwards
    // joining the forward before them; each unit's Ws apart.
    int32_t paired = total - interleavedWarmup(o, r), backwards = 0;
    std::vector<Order> units, weightGrads;
    for (const Instr &i : list) {
      if (!isCompute(i.op))
        continue;
      if (i.op == Op::WeightGrad) {
        weightGrads.back().push_back(i);
        continue;
      }
      if (units.empty() ||
          !(i.op == Op::Backward && backwards++ < paired)) {
        units.emplace_back();
        weightGrads.emplace_back();
      }
      units.back().push_back(i);
    }
    // Each transfer's unit: that of the compute it sends from or
    // receives for.
    std::map<std::tuple<int, int32_t, int32_t>, size_t> unitOf;
    for (size_t u = 0; u < units.size(); ++u)
      for (const Instr &i : units[u])
        unitOf[{static_cast<int>(i.op), i.microbatch, i.chunk}] = u;
    std::vector<Order> sends(units.size()), receives(units.size());
    for (const Instr &i : list) {
      if (isCompute(i.op))
        continue;
      Op of = i.op == Op::SendForward || i.op == Op::RecvForward
                  ? Op::Forward
                  : Op::Backward;
      size_t u = unitOf[{static_cast<int>(of), i.microbatch, i.chunk}];
      (i.op == Op::SendForward || i.op == Op::SendBackward ? sends : receives)[u]
          .push_back(i);
    }
    Order out;
    auto append = [&](const Order &more) {
      out.insert(out.end(), more.begin(), more.end());
    };
    for (size_t u = 0; u < units.size(); ++u) {
      if (u > 0)
        append(sends[u - 1]);
      append(receives[u]);
      if (u > 0)
        append(weightGrads[u - 1]);
      append(units[u]);
    }
    if (!units.empty()) {
      append(sends.back());
      append(weightGrads.back());
    }
    list = std::move(out);
  }
}

} // namespace

GenerateResult generate(const Options &o) {
  auto fail = [](std::string why) { return GenerateResult{std::nullopt, why}; };
  if (o.stages < 1)
    return fail("a pipeline needs at least 1 stage, not " +
                std::to_string(o.stages));
  if (o.microbatches < 1)
    return fail("a pipeline needs at least 1 micro-batch, not " +
                std::to_string(o.microbatches));
  if (o.chunks < 1 || (o.chunks > 1 && o.policy != Policy::Interleaved))
    return fail(std::string("only the interleaved schedule runs several "
                            "chunks per rank (") +
                policyName(o.policy) + " with " + std::to_string(o.chunks) +
                ")");
  if (o.policy == Policy::Interleaved && o.microbatches % o.stages != 0)
    return fail("the interleaved schedule runs micro-batches in groups of "
                "the " +
                std::to_string(o.stages) + " pipeline ranks; " +
                std::to_string(o.microbatches) +
                " micro-batches is not a multiple (--microbatches=" +
                std::to_string(o.stages) + ", " +
                std::to_string(2 * o.stages) +
                ", ... would; or another schedule)");
  std::vector<Order> compute(o.stages);
  for (int32_t r = 0; r < o.stages; ++r) {
    switch (o.policy) {
    case Policy::GPipe:
      compute[r] = gpipe(o, r);
      break;
    case Policy::OneFOneB:
      compute[r] = oneFOneB(o, r, /*withW=*/true);
      break;
    case Policy::Interleaved:
      compute[r] = interleaved(o, r);
      break;
    case Policy::ZeroBubbleH1:
      compute[r] = oneFOneB(o, r, /*withW=*/false);
      break;
    }
  }
  if (o.policy == Policy::ZeroBubbleH1 && !o.forwardOnly) {
    // Place each W by replaying with unit durations.
    Replay replay(o, Durations{}, compute, /*implicitTransfers=*/true,
                  /*flexibleWeightGrads=*/true);
    std::string error = replay.run();
    if (!error.empty())
      return fail("zb-h1: " + error);
    compute = std::move(replay.order);
  }
  Schedule s;
  s.options = o;
  s.ranks = withTransfers(o, compute);
  // Interleaved training lists deadlock as NCCL groups with each receive
  // just before the compute that reads it (every other list passes).
  if (o.policy == Policy::Interleaved && !o.forwardOnly)
    exchangeBetweenUnits(o, s.ranks);
  return GenerateResult{std::move(s), ""};
}

std::string checkGroupedTransfers(const Schedule &schedule) {
  Replay replay(schedule.options, Durations{}, schedule.ranks,
                /*implicitTransfers=*/false, /*flexibleWeightGrads=*/false);
  return replay.checkGroups();
}

SimulateResult simulate(const Schedule &schedule, const Durations &durations) {
  const Options &o = schedule.options;
  if (static_cast<int32_t>(schedule.ranks.size()) != o.stages)
    return {std::nullopt,
            "the schedule has " + std::to_string(schedule.ranks.size()) +
                " rank lists for " + std::to_string(o.stages) + " stages"};
  Replay replay(o, durations, schedule.ranks, /*implicitTransfers=*/false,
                /*flexibleWeightGrads=*/false);
  std::string error = replay.run();
  if (!error.empty())
    return {std::nullopt, error};
  return {std::move(replay.sim), ""};
}

} // namespace pcc::schedule
