// The one file that knows Python: nanobind bindings for the native token index.
// The Python classes in agspec/index/token_index.py hold these objects as handles and do the
// argument checking; this layer only converts types and releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "branch_trie.h"
#include "cursor_set.h"
#include "match_cursor.h"
#include "messages.h"
#include "token_index.h"
#include "tree_size.h"
#include "workers.h"

namespace nb = nanobind;
using agspec::CursorSet;
using agspec::MatchCursor;
using agspec::Token;
using agspec::TokenIndex;

using TokenArray = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

namespace {

// advance_batch begun (agspec::AdvanceBatch) with what it reads: the sets (held, so that
// none is freed while a helper moves its cursors) and their tokens. Members go in
// reverse order: the run (which finishes) before the arrays it reads.
struct AdvanceJob {
  nb::list sets;
  std::vector<CursorSet*> ptrs;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<const Token*> data;
  std::vector<size_t> lengths;
  std::unique_ptr<agspec::AdvanceBatch> run;
};

// The tries of a batch step, flat (continuation_tries' layout): grow_trees sizes them
// where they are.
struct FlatTries {
  agspec::BranchTrie flat;
  std::vector<int32_t> node_starts, origin_starts;
};

// The tries of a batch step, one after another (FlatTries' layout).
FlatTries flatten(const std::vector<agspec::BranchTrie>& tries) {
  FlatTries out;
  agspec::BranchTrie& flat = out.flat;
  size_t num_nodes = 0, num_origins = 0;
  for (const agspec::BranchTrie& t : tries) {
    num_nodes += t.tokens.size();
    num_origins += t.origin.size();
  }
  flat.tokens.reserve(num_nodes);
  flat.parents.reserve(num_nodes);
  flat.support.reserve(num_nodes);
  flat.branch_of.reserve(num_nodes);
  flat.origin.reserve(num_origins);
  out.node_starts.reserve(tries.size() + 1);
  out.origin_starts.reserve(tries.size() + 1);
  out.node_starts.push_back(0);
  out.origin_starts.push_back(0);
  for (const agspec::BranchTrie& t : tries) {
    flat.tokens.insert(flat.tokens.end(), t.tokens.begin(), t.tokens.end());
    flat.parents.insert(flat.parents.end(), t.parents.begin(), t.parents.end());
    flat.support.insert(flat.support.end(), t.support.begin(), t.support.end());
    flat.branch_of.insert(flat.branch_of.end(), t.branch_of.begin(), t.branch_of.end());
    flat.origin.insert(flat.origin.end(), t.origin.begin(), t.origin.end());
    out.node_starts.push_back(int32_t(flat.tokens.size()));
    out.origin_starts.push_back(int32_t(flat.origin.size()));
  }
  return out;
}

// size_trees_at_prices over the flat tries of a batch step (FlatTries' lists).
std::tuple<std::vector<int32_t>, std::vector<int32_t>, std::vector<int32_t>, std::vector<int32_t>,
           std::vector<int32_t>>
size_tries(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
           const std::vector<int32_t>& support, const std::vector<int32_t>& branch_of,
           const std::vector<int32_t>& node_starts, const std::vector<int64_t>& trees,
           const std::vector<int64_t>& branch_starts, const std::vector<int64_t>& branch_curves,
           const std::vector<std::vector<double>>& curves,
           const std::vector<std::vector<double>>& rate_tables, const std::vector<int64_t>& rate_of,
           const std::vector<int64_t>& budgets, const std::vector<double>& prices) {
  const size_t num_nodes = parents.size();
  if (tokens.size() != num_nodes || support.size() != num_nodes || branch_of.size() != num_nodes) {
    throw agspec::ArgumentError(
        "size_trees_at_prices: one token, parent, support and branch per node");
  }
  if (node_starts.empty() || size_t(node_starts.back()) != num_nodes) {
    throw agspec::ArgumentError("size_trees_at_prices: node_starts must end at the nodes");
  }
  const size_t num_sized = trees.size();
  if (branch_starts.size() != num_sized + 1 || rate_of.size() != num_sized ||
      budgets.size() != num_sized) {
    throw agspec::ArgumentError(
        "size_trees_at_prices: one rate table and budget per sized tree, and "
        "branch_starts one longer");
  }
  if (size_t(branch_starts.back()) != branch_curves.size()) {
    throw agspec::ArgumentError(
        "size_trees_at_prices: branch_starts must end at the branch curves");
  }
  std::vector<double> curve_values, rate_values;
  std::vector<int64_t> curve_starts{0};
  curve_starts.reserve(curves.size() + 1);
  for (const std::vector<double>& c : curves) {
    curve_values.insert(curve_values.end(), c.begin(), c.end());
    curve_starts.push_back(int64_t(curve_values.size()));
  }
  const size_t per_table = rate_tables.empty() ? 1 : rate_tables[0].size();
  for (const std::vector<double>& r : rate_tables) {
    if (r.size() != per_table) {
      throw agspec::ArgumentError("size_trees_at_prices: rate tables of unequal sizes");
    }
    rate_values.insert(rate_values.end(), r.begin(), r.end());
  }
  const agspec::FlatTrieView view{tokens.data(),    parents.data(),     support.data(),
                                  branch_of.data(), node_starts.data(), node_starts.size() - 1};
  const agspec::TreeSizingView sizing{trees.data(),
                                      branch_starts.data(),
                                      branch_curves.data(),
                                      curve_values.data(),
                                      curve_starts.data(),
                                      curves.size(),
                                      rate_values.data(),
                                      rate_tables.size(),
                                      per_table,
                                      rate_of.data(),
                                      budgets.data(),
                                      prices.data(),
                                      prices.size(),
                                      num_sized};
  agspec::KeptTrees kept;
  agspec::size_trees_at_prices(view, sizing, &kept);
  using Ints = std::vector<int32_t>;
  return std::tuple<Ints, Ints, Ints, Ints, Ints>(std::move(kept.tokens), std::move(kept.parents),
                                                  std::move(kept.support), std::move(kept.starts),
                                                  std::move(kept.num_chain));
}

// A batch step's tree candidates, listed and handed to the helpers to copy
// (agspec::ContinuationGroupsRun) while Python plans the chains; grow_begun_trees merges
// and sizes the trees wanted. Holds the sets (none is freed while a helper reads it) and
// the arrays the helpers read; members go in reverse order: the run before its arrays.
struct TreeJob {
  nb::list sets;
  std::vector<CursorSet*> ptrs;
  std::vector<int64_t> slots, max_tokens, ranks, counts, starts;
  std::vector<agspec::ContinuationRule> rules;
  std::vector<std::vector<Token>> conts;
  bool grown = false;
  std::unique_ptr<agspec::ContinuationGroupsRun> run;
};

// The first half of the batched tree step's middle (agspec.drafter.batch._grow_trees,
// whose Python path is the reference): every request's corpora's match lengths, then its
// candidates, every (slot, rule of `rules`) whose match is at least min_match except its
// chain's own (primary slot, primary rule), ranked by minus the match, depths[t] tokens
// each (tree_candidates' order: slot by slot, rule by rule), handed to the helpers.
std::unique_ptr<TreeJob> tree_candidates_begin(
    nb::list sets, const std::vector<int64_t>& primary_slots,
    const std::vector<agspec::ContinuationRule>& primary_rules,
    const std::vector<agspec::ContinuationRule>& rules, int64_t min_match,
    const std::vector<int64_t>& depths, size_t max_occurrences) {
  const size_t num_trees = nb::len(sets);
  if (primary_slots.size() != num_trees || primary_rules.size() != num_trees ||
      depths.size() != num_trees) {
    throw agspec::ArgumentError(
        "tree_candidates_begin: one primary slot and rule and depth per set");
  }
  auto job = std::make_unique<TreeJob>();
  job->sets = sets;
  job->ptrs.resize(num_trees);
  size_t num_lengths = 0;
  for (size_t t = 0; t < num_trees; ++t) {
    nb::handle h = sets[t];
    if (h.is_none()) throw agspec::ArgumentError("tree_candidates_begin: a set is None");
    job->ptrs[t] = nb::cast<CursorSet*>(h);
    num_lengths += job->ptrs[t]->size();
    if (depths[t] < 1) throw agspec::ArgumentError("tree_candidates_begin: a depth below 1");
  }
  job->run = std::make_unique<agspec::ContinuationGroupsRun>(job->ptrs.data(), num_trees);
  std::vector<int32_t> lengths(num_lengths);
  job->run->match_lengths(lengths.data());
  job->counts.resize(num_trees);
  job->starts.assign(num_trees + 1, 0);
  const int64_t least = min_match < 1 ? 1 : min_match;
  size_t at = 0;
  for (size_t t = 0; t < num_trees; ++t) {
    const size_t num_slots = job->ptrs[t]->size();
    for (size_t slot = 0; slot < num_slots; ++slot) {
      const int32_t m = lengths[at + slot];
      if (m < least) continue;
      for (const agspec::ContinuationRule r : rules) {
        if (int64_t(slot) == primary_slots[t] && r == primary_rules[t]) continue;
        job->slots.push_back(int64_t(slot));
        job->rules.push_back(r);
        job->ranks.push_back(-int64_t(m));
        job->max_tokens.push_back(depths[t]);
      }
    }
    at += num_slots;
    job->starts[t + 1] = int64_t(job->slots.size());
    job->counts[t] = job->starts[t + 1] - job->starts[t];
  }
  job->conts.resize(job->slots.size());
  job->run->start(job->counts.data(), job->slots.data(), job->max_tokens.data(), job->rules.data(),
                  max_occurrences, job->conts.data());
  return job;
}

// The second half: the candidates of job's requests trees[j] copied (the helpers' work,
// finished) and merged into one trie each after firsts[j] (merge_branches, on the
// helpers); then every tree whose candidates add a branch scored and sized at the step's
// prices. Branch 0 follows curves[chain_curves[j]], a later branch the curve of its
// corpus's match: curves[match_curves[agent_of[j]][bucket_of_match[min(match, last)]]];
// q_a is rate_tables[agent_of[j]]. Which rules, buckets, curves and prices, is Python's.
// Returns the sized trees (j) and their kept trees (size_tries' five lists).
std::tuple<std::vector<int32_t>, std::vector<int32_t>, std::vector<int32_t>, std::vector<int32_t>,
           std::vector<int32_t>, std::vector<int32_t>>
grow_begun_trees(TreeJob& job, const std::vector<int64_t>& trees,
                 const std::vector<std::vector<Token>>& firsts,
                 const std::vector<int64_t>& chain_curves, const std::vector<int64_t>& agent_of,
                 const std::vector<std::vector<int64_t>>& match_curves,
                 const std::vector<int64_t>& bucket_of_match,
                 const std::vector<std::vector<double>>& curves,
                 const std::vector<std::vector<double>>& rate_tables,
                 const std::vector<int64_t>& budgets, const std::vector<double>& prices) {
  if (job.grown) {
    throw agspec::ArgumentError("grow_begun_trees: these candidates were grown or dropped already");
  }
  job.grown = true;
  const size_t num_begun = job.ptrs.size(), num_trees = trees.size();
  std::vector<char> wanted(num_begun, 0);
  for (const int64_t t : trees) {
    if (t < 0 || size_t(t) >= num_begun || wanted[size_t(t)]) {
      job.run->finish(nullptr);
      throw agspec::ArgumentError(
          "grow_begun_trees: trees must be distinct requests of the begun candidates");
    }
    wanted[size_t(t)] = 1;
  }
  if (firsts.size() != num_trees || chain_curves.size() != num_trees ||
      agent_of.size() != num_trees || budgets.size() != num_trees || bucket_of_match.empty() ||
      match_curves.size() != rate_tables.size()) {
    job.run->finish(nullptr);
    throw agspec::ArgumentError(
        "grow_begun_trees: one first branch, chain curve, agent and budget per tree, "
        "bucket_of_match not empty, and match_curves one row per rate table");
  }
  for (size_t j = 0; j < num_trees; ++j) {
    if (agent_of[j] < 0 || size_t(agent_of[j]) >= rate_tables.size()) {
      job.run->finish(nullptr);
      throw agspec::ArgumentError("grow_begun_trees: an agent index out of range");
    }
  }
  job.run->finish(wanted.data());
  const std::vector<int64_t>& starts = job.starts;
  std::vector<agspec::BranchTrie> tries(num_trees);
  agspec::merge_groups(firsts.data(), trees.data(), num_trees, job.conts.data(), job.ranks.data(),
                       starts.data(), job.counts.data(), tries.data());
  // The trees whose candidates add a branch, and their branches' curves.
  std::vector<int64_t> sized, branch_starts{0}, branch_curves, rate_of, sized_budgets;
  const size_t last_match = bucket_of_match.size() - 1;
  for (size_t j = 0; j < num_trees; ++j) {
    const size_t t = size_t(trees[j]);
    const std::vector<int32_t>& origin = tries[j].origin;
    if (job.counts[t] == 0 || origin.size() <= 1) continue;
    const std::vector<int64_t>& row = match_curves[size_t(agent_of[j])];
    branch_curves.push_back(chain_curves[j]);
    for (size_t k = 1; k < origin.size(); ++k) {
      const int64_t m = -job.ranks[size_t(starts[t] + origin[k])];
      const int64_t bucket = bucket_of_match[size_t(m) < last_match ? size_t(m) : last_match];
      if (bucket < 0 || size_t(bucket) >= row.size()) {
        throw agspec::ArgumentError("grow_begun_trees: a match bucket without a curve");
      }
      branch_curves.push_back(row[size_t(bucket)]);
    }
    branch_starts.push_back(int64_t(branch_curves.size()));
    sized.push_back(int64_t(j));
    rate_of.push_back(agent_of[j]);
    sized_budgets.push_back(budgets[j]);
  }
  std::vector<int32_t> sized_out(sized.begin(), sized.end());
  if (sized.empty()) {
    using Ints = std::vector<int32_t>;
    return {std::move(sized_out), Ints{}, Ints{}, Ints{}, Ints{0}, Ints{}};
  }
  const FlatTries flat = flatten(tries);
  auto [tokens, parents, support, kept_starts, num_chain] = size_tries(
      flat.flat.tokens, flat.flat.parents, flat.flat.support, flat.flat.branch_of, flat.node_starts,
      sized, branch_starts, branch_curves, curves, rate_tables, rate_of, sized_budgets, prices);
  return {std::move(sized_out), std::move(tokens),      std::move(parents),
          std::move(support),   std::move(kept_starts), std::move(num_chain)};
}

// Long calls run without the GIL; the index's own guards keep other threads out (a
// racing call raises IndexStateError).
constexpr size_t kReleaseGilTokens = 4096;

// A handle the Python side can close; cursors keep only a weak reference. Every call
// holds its own reference for its whole length, so close() in another thread (which
// marks the index closed and drops the handle's reference) can never free an index
// that a call without the GIL is still inside.
struct IndexHandle {
  std::shared_ptr<TokenIndex> index;

  std::shared_ptr<TokenIndex> get() const {
    if (!index) throw agspec::StateError("the index was closed");
    return index;
  }
};

// A token id from a Python int or an integer numpy scalar. Anything else (a float, a
// str, a bool) is a TypeError, not truncated or parsed; outside [0, 2^31) a ValueError.
Token token_id(nb::handle h) {
  PyObject* o = h.ptr();
  int overflow = 0;
  long long v;
  if (PyLong_CheckExact(o)) {
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
  } else {
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
      throw nb::type_error(
          (std::string("a token id must be an int, got ") + Py_TYPE(o)->tp_name).c_str());
    }
    nb::object i = nb::steal(PyNumber_Index(o));
    if (!i.is_valid()) {
      PyErr_Clear();
      throw nb::type_error(
          (std::string("a token id must be an int, got ") + Py_TYPE(o)->tp_name).c_str());
    }
    v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  }
  if (overflow != 0 || v < 0 || v > INT32_MAX) {
    throw nb::value_error(
        ("token ids must be in [0, 2^31), got " + std::string(nb::repr(h).c_str())).c_str());
  }
  return static_cast<Token>(v);
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "AgSpec native token index (C++). Use agspec.index.token_index, not this module.";

  nb::exception<agspec::FormatError>(m, "IndexFormatError", PyExc_ValueError);
  nb::exception<agspec::StateError>(m, "IndexStateError", PyExc_RuntimeError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const agspec::DocumentError& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    } catch (const agspec::ArgumentError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<IndexHandle>(m, "TokenIndex")
      .def("__init__",
           [](IndexHandle* self) { new (self) IndexHandle{std::make_shared<TokenIndex>()}; })
      .def_static(
          "load",
          [](const std::string& path) {
            std::shared_ptr<TokenIndex> idx;
            {
              nb::gil_scoped_release release;
              idx = TokenIndex::load(path);
            }
            return IndexHandle{idx};
          },
          nb::arg("path"))
      .def(
          "extend",
          [](IndexHandle& self, int64_t doc_id, TokenArray tokens) {
            const auto idx = self.get();
            const Token* data = tokens.data();
            const size_t n = tokens.shape(0);
            if (n >= kReleaseGilTokens) {
              nb::gil_scoped_release release;
              idx->extend(doc_id, data, n);
            } else {
              idx->extend(doc_id, data, n);
            }
          },
          nb::arg("doc_id"), nb::arg("tokens"))
      .def(
          "extend_list",
          [](IndexHandle& self, int64_t doc_id, const std::vector<int32_t>& tokens) {
            self.get()->extend(doc_id, tokens.data(), tokens.size());
          },
          nb::arg("doc_id"), nb::arg("tokens"))
      .def(
          "remove",
          [](IndexHandle& self, int64_t doc_id) {
            const auto idx = self.get();
            nb::gil_scoped_release release;
            idx->remove(doc_id);
          },
          nb::arg("doc_id"))
      .def(
          "save",
          [](IndexHandle& self, const std::string& path) {
            const auto idx = self.get();
            nb::gil_scoped_release release;
            idx->save(path);
          },
          nb::arg("path"))
      .def("verify",
           [](IndexHandle& self) {
             const auto idx = self.get();
             nb::gil_scoped_release release;
             idx->verify();
           })
      .def("close",
           [](IndexHandle& self) {
             if (self.index) self.index->close();
             self.index.reset();
           })
      .def_prop_ro("closed", [](const IndexHandle& self) { return !self.index; })
      .def(
          "hold_for_writing",
          [](IndexHandle& self, nb::callable fn) {
            self.get()->hold_for_writing([&fn] { fn(); });  // fn runs holding the GIL
          },
          nb::arg("fn"))
      .def("contains", [](const IndexHandle& self, int64_t id) { return self.get()->contains(id); })
      .def("document", [](const IndexHandle& self, int64_t id) { return self.get()->document(id); })
      .def("document_ids", [](const IndexHandle& self) { return self.get()->document_ids(); })
      .def("num_documents", [](const IndexHandle& self) { return self.get()->num_documents(); })
      .def("num_tokens", [](const IndexHandle& self) { return self.get()->num_tokens(); })
      .def("num_positions", [](const IndexHandle& self) { return self.get()->num_positions(); })
      .def("num_states", [](const IndexHandle& self) { return self.get()->num_states(); })
      .def("num_bytes", [](const IndexHandle& self) { return self.get()->num_bytes(); })
      .def("frozen", [](const IndexHandle& self) { return self.get()->frozen(); })
      .def("freeze", [](IndexHandle& self) { self.get()->freeze(); })
      .def(
          "cursor",
          [](const IndexHandle& self, int32_t max_match_tokens) {
            return MatchCursor(self.get(), max_match_tokens);
          },
          nb::arg("max_match_tokens"));

  nb::enum_<agspec::ContinuationRule>(m, "ContinuationRule")
      .value("frequent", agspec::ContinuationRule::kFrequent)
      .value("first", agspec::ContinuationRule::kFirst)
      .value("recent", agspec::ContinuationRule::kRecent)
      .value("vote", agspec::ContinuationRule::kVote)
      .value("recent2", agspec::ContinuationRule::kRecent2)
      .value("recent3", agspec::ContinuationRule::kRecent3)
      .value("recent4", agspec::ContinuationRule::kRecent4)
      .value("recent5", agspec::ContinuationRule::kRecent5)
      .value("recent6", agspec::ContinuationRule::kRecent6)
      .value("recent7", agspec::ContinuationRule::kRecent7)
      .value("recent8", agspec::ContinuationRule::kRecent8);

  nb::class_<MatchCursor>(m, "MatchCursor")
      .def(
          "extend",
          [](MatchCursor& c, TokenArray tokens) { c.extend(tokens.data(), tokens.shape(0)); },
          nb::arg("tokens"))
      .def(
          "extend_list",
          [](MatchCursor& c, const std::vector<int32_t>& tokens) {
            c.extend(tokens.data(), tokens.size());
          },
          nb::arg("tokens"))
      .def(
          "extend_one",
          [](MatchCursor& c, nb::handle token) {
            const Token t = token_id(token);
            c.extend(&t, 1);
          },
          nb::arg("token").none(), nb::sig("def extend_one(self, token: int) -> None"))
      .def("match_length", &MatchCursor::match_length)
      .def(
          "occurrences",
          [](MatchCursor& c, size_t max_count) {
            std::vector<std::pair<int64_t, int64_t>> out;
            for (const auto& o : c.occurrences(max_count)) out.emplace_back(o.doc_id, o.end_offset);
            return out;
          },
          nb::arg("max_count"))
      .def("continuation", &MatchCursor::continuation, nb::arg("max_tokens"), nb::arg("rule"),
           nb::arg("max_occurrences"))
      .def_prop_ro("num_fed", &MatchCursor::num_fed)
      .def_prop_ro("max_match_tokens", &MatchCursor::max_match);

  // A request's cursors over its corpora, moved and read in one call per step
  // (agspec.corpora.corpus_set); the *_batch functions do the same for many requests at once.
  nb::class_<CursorSet>(m, "CursorSet")
      .def(nb::init<>())
      .def(
          "add_cursor",
          [](CursorSet& s, const IndexHandle& index, int32_t max_match_tokens,
             const std::vector<int32_t>& tail) {
            return s.add_cursor(index.get(), max_match_tokens, tail.data(), tail.size());
          },
          nb::arg("index"), nb::arg("max_match_tokens"), nb::arg("tail"))
      .def(
          "add_append",
          [](CursorSet& s, const IndexHandle& index, int64_t doc_id) {
            s.add_append(index.get(), doc_id);
          },
          nb::arg("index"), nb::arg("doc_id"))
      .def(
          "remove_append",
          [](CursorSet& s, const IndexHandle& index) { s.remove_append(index.index.get()); },
          nb::arg("index"))
      .def(
          "advance",
          [](CursorSet& s, const std::vector<int32_t>& tokens) {
            s.advance(tokens.data(), tokens.size());
          },
          nb::arg("tokens"))
      .def("match_lengths",
           [](CursorSet& s) {
             std::vector<int32_t> out(s.size());
             s.match_lengths(out.data());
             return out;
           })
      .def("continuation", &CursorSet::continuation, nb::arg("slot"), nb::arg("max_tokens"),
           nb::arg("rule"), nb::arg("max_occurrences"))
      .def("set_order", &CursorSet::set_order, nb::arg("order"))
      .def("match_pick", &CursorSet::match_pick, nb::arg("min_match"))
      .def("flush", &CursorSet::flush)
      .def("__len__", &CursorSet::size);

  // The session corpus's message split (agspec.corpora.session): one pass over the
  // prompt, without the GIL for a long one.
  m.def(
      "message_keys",
      [](const std::vector<int32_t>& tokens, int64_t separator, size_t known) {
        agspec::MessageKeys k;
        if (tokens.size() >= kReleaseGilTokens) {
          nb::gil_scoped_release release;
          k = agspec::message_keys(tokens.data(), tokens.size(), separator, known);
        } else {
          k = agspec::message_keys(tokens.data(), tokens.size(), separator, known);
        }
        return std::make_tuple(k.first, std::move(k.starts), std::move(k.keys));
      },
      nb::arg("tokens"), nb::arg("separator"), nb::arg("known"));
  nb::class_<AdvanceJob>(m, "AdvanceJob").def("finish", [](AdvanceJob& job) { job.run->finish(); });
  m.def(
      "advance_batch_begin",
      [](nb::list sets, std::vector<std::vector<int32_t>> tokens) {
        auto job = std::make_unique<AdvanceJob>();
        const size_t n = nb::len(sets);
        if (n != tokens.size()) {
          throw agspec::ArgumentError("advance_batch: one token list per cursor set");
        }
        job->sets = sets;  // the sets stay alive while helpers may work on them
        job->tokens = std::move(tokens);
        job->ptrs.resize(n);
        job->data.resize(n);
        job->lengths.resize(n);
        for (size_t i = 0; i < n; ++i) {
          nb::handle h = sets[i];
          if (h.is_none()) throw agspec::ArgumentError("advance_batch: a set is None");
          job->ptrs[i] = nb::cast<CursorSet*>(h);
          job->data[i] = job->tokens[i].data();
          job->lengths[i] = job->tokens[i].size();
        }
        job->run = std::make_unique<agspec::AdvanceBatch>(job->ptrs.data(), job->data.data(),
                                                          job->lengths.data(), n);
        return job;
      },
      nb::arg("sets"), nb::arg("tokens"));
  m.def(
      "match_lengths_batch",
      [](const std::vector<CursorSet*>& sets) {
        size_t total = 0;
        for (const CursorSet* s : sets) {
          if (s == nullptr) throw agspec::ArgumentError("match_lengths_batch: a set is None");
          total += s->size();
        }
        std::vector<int32_t> out(total);
        agspec::match_lengths_batch(sets.data(), sets.size(), out.data());
        return out;
      },
      nb::arg("sets"));
  m.def(
      "match_picks_batch",
      [](const std::vector<CursorSet*>& sets, int32_t min_match) {
        for (const CursorSet* s : sets) {
          if (s == nullptr) throw agspec::ArgumentError("match_picks_batch: a set is None");
        }
        std::vector<int32_t> out(2 * sets.size());
        agspec::match_picks_batch(sets.data(), sets.size(), min_match, out.data());
        return out;
      },
      nb::arg("sets"), nb::arg("min_match"));
  m.def(
      "continuation_batch",
      [](const std::vector<CursorSet*>& sets, const std::vector<int64_t>& slots,
         const std::vector<int64_t>& max_tokens, const std::vector<agspec::ContinuationRule>& rules,
         size_t max_occurrences) {
        if (slots.size() != sets.size() || max_tokens.size() != sets.size() ||
            rules.size() != sets.size()) {
          throw agspec::ArgumentError("continuation_batch: one slot, length and rule per set");
        }
        for (size_t i = 0; i < sets.size(); ++i) {
          if (sets[i] == nullptr && slots[i] >= 0 && max_tokens[i] > 0) {
            throw agspec::ArgumentError("continuation_batch: a set is None");
          }
        }
        std::vector<std::vector<Token>> out(sets.size());
        agspec::continuation_batch(sets.data(), slots.data(), max_tokens.data(), rules.data(),
                                   max_occurrences, sets.size(), out.data());
        return out;
      },
      nb::arg("sets"), nb::arg("slots"), nb::arg("max_tokens"), nb::arg("rules"),
      nb::arg("max_occurrences"));
  // A token tree's candidates (cpp/index/branch_trie.h): every candidate continuation
  // copied as continuation_batch does (one set per tree), then one trie per tree. The
  // tries come back flat, tree after tree, in seven lists (tokens, parents, support,
  // branch_of, origin, node_starts, origin_starts); tree t's nodes are node_starts[t] ..
  // node_starts[t + 1] - 1 of the first four (parents and branch_of counted within the
  // tree), its origin origin_starts[t] .. origin_starts[t + 1] - 1 of the fifth.
  m.def(
      "continuation_tries",
      [](const std::vector<CursorSet*>& sets, const std::vector<int64_t>& slots,
         const std::vector<int64_t>& max_tokens, const std::vector<agspec::ContinuationRule>& rules,
         size_t max_occurrences, const std::vector<int64_t>& ranks,
         const std::vector<int64_t>& counts, const std::vector<std::vector<Token>>& firsts) {
        const size_t n = slots.size();
        if (max_tokens.size() != n || rules.size() != n || ranks.size() != n) {
          throw agspec::ArgumentError(
              "continuation_tries: one slot, length, rule and rank per candidate");
        }
        if (counts.size() != firsts.size() || sets.size() != firsts.size()) {
          throw agspec::ArgumentError("continuation_tries: one set and count per first branch");
        }
        for (CursorSet* set : sets) {
          if (set == nullptr) throw agspec::ArgumentError("continuation_tries: a set is None");
        }
        std::vector<agspec::BranchTrie> tries(counts.size());
        agspec::continuation_tries(sets.data(), slots.data(), max_tokens.data(), rules.data(),
                                   max_occurrences, n, ranks.data(), counts.data(), firsts.data(),
                                   counts.size(), tries.data());
        FlatTries f = flatten(tries);
        return std::make_tuple(std::move(f.flat.tokens), std::move(f.flat.parents),
                               std::move(f.flat.support), std::move(f.flat.branch_of),
                               std::move(f.flat.origin), std::move(f.node_starts),
                               std::move(f.origin_starts));
      },
      nb::arg("sets"), nb::arg("slots"), nb::arg("max_tokens"), nb::arg("rules"),
      nb::arg("max_occurrences"), nb::arg("ranks"), nb::arg("counts"), nb::arg("firsts"));
  // The batched tree step's scoring and sizing (cpp/policy/tree_size.h): the tries in
  // continuation_tries' flat layout (tokens, parents, support, branch_of, node_starts),
  // then per sized tree its index in them, its branches' curves (ids into `curves`,
  // branch_starts per sized tree), its rate table (an index into `rate_tables`) and its
  // budget; the step's prices. Returns the kept trees (tokens, parents, support, starts,
  // num_chain): sized tree j is starts[j] .. starts[j + 1] - 1 of the first three.
  m.def("size_trees_at_prices", &size_tries, nb::arg("tokens"), nb::arg("parents"),
        nb::arg("support"), nb::arg("branch_of"), nb::arg("node_starts"), nb::arg("trees"),
        nb::arg("branch_starts"), nb::arg("branch_curves"), nb::arg("curves"),
        nb::arg("rate_tables"), nb::arg("rate_of"), nb::arg("budgets"), nb::arg("prices"));
  // drop(): the candidates not wanted after all (the helpers stop, the indexes are left).
  nb::class_<TreeJob>(m, "TreeCandidates").def("drop", [](TreeJob& job) {
    job.grown = true;
    job.run->finish(nullptr);
  });
  m.def("tree_candidates_begin", &tree_candidates_begin, nb::arg("sets"), nb::arg("primary_slots"),
        nb::arg("primary_rules"), nb::arg("rules"), nb::arg("min_match"), nb::arg("depths"),
        nb::arg("max_occurrences"));
  m.def("grow_begun_trees", &grow_begun_trees, nb::arg("job"), nb::arg("trees"), nb::arg("firsts"),
        nb::arg("chain_curves"), nb::arg("agent_of"), nb::arg("match_curves"),
        nb::arg("bucket_of_match"), nb::arg("curves"), nb::arg("rate_tables"), nb::arg("budgets"),
        nb::arg("prices"));
  // How many threads a large batched call uses (cpp/index/workers.h).
  m.def("batch_threads", &agspec::batch_threads);
  m.def("prepare_batch", &agspec::prepare_batch, nb::arg("num_sets"));
  // Whether the index's large arrays are advised for 2 MB pages (cpp/index/large_pages.h).
  m.def("large_pages", &agspec::large_pages_enabled);
  m.def("set_large_pages", &agspec::set_large_pages, nb::arg("enabled"));
  m.def(
      "set_batch_threads",
      [](int64_t n) {
        if (n < 0 || n > 64)
          throw agspec::ArgumentError("batch threads must be 0 to 64 (0: default)");
        agspec::set_batch_threads(size_t(n));
      },
      nb::arg("threads"));
}
