// titan export        --checkpoint STEP_DIR --out DIR [--dtype float32|bfloat16] [--tokenizer PATH]
// titan verify-export DIR [--source STEP_DIR] [--dataset PATH] [--batch N --seq S]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "titan/autograd/autograd.h"
#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/data/assets.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/checkpoint.h"
#include "titan/train/metrics.h"
#include "titan/train/native_model.h"

namespace titan::cli {
namespace {

namespace fs = std::filesystem;

// The first entry of `dir` (sorted by name) that a titan export does not write, or "": --overwrite
// removes the whole folder, so anything else in it (notes, an export nested inside) would go with
// it. A titan export writes config.json, generation_config.json, the safetensors (one file, or the
// shards and their index), titan_checksums.json and the tokenizer files it lists there.
std::string first_foreign_entry(const fs::path& dir) {
  std::set<std::string> own = {"config.json",
                               "generation_config.json",
                               std::string(io::kHfSingleFile),
                               std::string(io::kHfIndexFile),
                               io::kTensorChecksumsFile,
                               "tokenizer.json",
                               "tokenizer_config.json",
                               data::kChatTemplateFile};
  if (std::ifstream in(dir / io::kTensorChecksumsFile); in) {
    const nlohmann::json sums = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (sums.is_object() && sums.contains("files") && sums["files"].is_object())
      for (const auto& [name, sum] : sums["files"].items()) own.insert(name);
  }
  static const std::regex shard(R"(model-[0-9]{5}-of-[0-9]{5}\.safetensors)");
  std::vector<fs::directory_entry> entries(fs::directory_iterator(dir), {});
  std::sort(entries.begin(), entries.end());
  for (const fs::directory_entry& e : entries) {
    const std::string name = e.path().filename().string();
    std::error_code ec;
    const bool a_file = !e.is_symlink(ec) && e.is_regular_file(ec);
    if (!a_file || (!own.contains(name) && !std::regex_match(name, shard)))
      return name + (e.is_directory(ec) && !e.is_symlink(ec) ? "/" : "");
  }
  return "";
}

// The export (a folder with config.json beside its safetensors) that `out` would lie inside, or "".
fs::path enclosing_export(const fs::path& out) {
  fs::path whole = fs::absolute(out).lexically_normal();
  if (whole.filename().empty()) whole = whole.parent_path();  // "hf/shell/.." is "hf/", hf itself
  for (fs::path dir = whole.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    std::error_code ec;  // a folder above that cannot be searched holds no export of this user's
    if (fs::exists(dir / "config.json", ec) && io::is_hf_checkpoint_dir(dir)) return dir;
    if (dir == dir.root_path()) break;
  }
  return {};
}

int export_main(int argc, char** argv) {
  ArgParser p("export", "Writes a Hugging Face checkpoint (config.json, safetensors, tokenizer files) from a\n"
                        "native titan checkpoint folder (step-N).");
  p.required("checkpoint", "native checkpoint folder, e.g. outputs/debugmodel/checkpoint/step-40")
      .required("out", "output directory (must not exist unless --overwrite)")
      .option("dtype", "float32 | bfloat16", "float32")
      .option("tokenizer", "tokenizer.json (or its folder) to ship instead of the one the run recorded")
      .flag("overwrite",
            "replace an earlier export (a folder holding only its files) or an empty folder at --out, "
            "atomically");
  if (!p.parse(argc, argv)) return 0;
  std::string d = p.get("dtype");
  TITAN_CHECK(d == "float32" || d == "bfloat16", "--dtype must be float32 or bfloat16, got '", d, "'");
  const fs::path out = p.get("out");
  // What --out may be is checked before the checkpoint is read (minutes for a large model); the
  // tokenizer files it must not touch are known once it is.
  io::check_output_path(out, {p.get("checkpoint")}, "titan export --out");
  // The export takes --out's place by a rename: a symbolic link there would itself be replaced (and
  // --overwrite failed at the end, after the whole export was written), not what it points to.
  TITAN_CHECK(!fs::is_symlink(out), "titan export --out: '", out.string(), "' is a symbolic link (to '",
              fs::read_symlink(out).string(),
              "'): an export is written in place of --out, not through a link; give the folder itself, or "
              "another path");
  TITAN_CHECK(p.has("overwrite") || !fs::exists(fs::symlink_status(out)), "titan export --out: '",
              out.string(),
              "' already exists (refusing to overwrite it): --overwrite replaces an earlier export (or an "
              "empty folder) there; or export elsewhere");
  // An export inside another would be deleted with it by that one's --overwrite, and makes it a folder
  // no longer of an export's files alone.
  if (const fs::path outer = enclosing_export(out); !outer.empty())
    TITAN_FAIL("titan export --out: '", out.string(), "' lies inside the export '", outer.string(),
               "' (a later --overwrite of that one would delete it); export elsewhere");
  if (p.has("overwrite") && fs::exists(fs::symlink_status(out))) {
    // --overwrite replaces an earlier export, not whatever folder the path names (notes, code, a home).
    const bool an_export =
        fs::is_directory(out) && fs::exists(out / "config.json") && io::is_hf_checkpoint_dir(out);
    TITAN_CHECK(
        an_export || (fs::is_directory(out) && fs::is_empty(out)), "titan export --out: '", out.string(),
        "' is not a Hugging Face export (no config.json beside model.safetensors): --overwrite replaces an "
        "earlier export only; remove the folder yourself or export elsewhere");
    TITAN_CHECK(!io::lies_within(fs::current_path(), out), "titan export --out: '", out.string(),
                "' holds the working directory '", fs::current_path().string(),
                "'; replacing it would pull the folder from under the shell that runs this");
    // ... and only the export: what else the folder holds would be deleted with it.
    if (an_export)
      if (const std::string foreign = first_foreign_entry(out); !foreign.empty())
        TITAN_FAIL("titan export --out: '", out.string(), "' holds '", foreign,
                   "', which is not a file of a titan export: --overwrite replaces the whole folder and "
                   "would delete it; move it out, or export elsewhere");
  }
  auto native = train::load_native_model(p.get("checkpoint"), DType::F32);
  if (!native.unresumable.empty()) std::printf("note: %s\n", native.unresumable.c_str());
  const std::optional<std::string> named_tokenizer = p.get_optional("tokenizer");
  const fs::path tokenizer = named_tokenizer ? fs::path(*named_tokenizer) : native.tokenizer_path;
  // The files shipped are the folder's tokenizer.json and tokenizer_config.json, under those names.
  TITAN_CHECK(!named_tokenizer || fs::is_directory(tokenizer) || tokenizer.filename() == "tokenizer.json",
              "titan export --tokenizer: '", tokenizer.string(),
              "' is neither a folder nor a file named tokenizer.json (the export ships the folder's "
              "tokenizer.json and tokenizer_config.json)");
  auto files = data::tokenizer_files(tokenizer);
  const bool has_tokenizer_json = std::any_of(
      files.begin(), files.end(), [](const fs::path& f) { return f.filename() == "tokenizer.json"; });
  TITAN_CHECK(!named_tokenizer || has_tokenizer_json, "titan export --tokenizer: '", *named_tokenizer,
              "' has no tokenizer.json");
  // The checkpoint names its tokenizer by path: a file replaced there since (a re-download, another
  // model's assets) would ship under this model and map its ids to other words.
  if (has_tokenizer_json && !native.tokenizer_checksum.empty() &&
      train::tokenizer_checksum(tokenizer) != native.tokenizer_checksum) {
    TITAN_CHECK(named_tokenizer, "the tokenizer at '", native.tokenizer_path.string(),
                "' (the run's, as its train_state.json names it) is not the one the checkpoint '",
                p.get("checkpoint"),
                "' was trained with: its tokenizer.json's checksum differs from the one recorded there "
                "(replaced since?); name the run's tokenizer with --tokenizer");
    std::printf("note: --tokenizer '%s' is not the tokenizer the checkpoint was trained with ('%s')\n",
                named_tokenizer->c_str(), native.tokenizer_path.string().c_str());
  }
  std::vector<fs::path> inputs = files;
  inputs.push_back(p.get("checkpoint"));
  io::check_output_path(out, inputs, "titan export --out");
  // The export is built in a temporary folder beside --out ("dir/" names dir), then moved into place.
  const fs::path beside = (out.filename().empty() ? out.parent_path() : out).parent_path();
  io::check_writable_folder(
      beside.empty() ? fs::path(".") : beside, "titan export --out",
      "the export is built there, then moved to '" + out.string() + "'; export elsewhere");
  if (files.empty())
    std::printf(
        "warning: tokenizer files of the run ('%s') not found; exporting without them (name them "
        "with --tokenizer)\n",
        native.tokenizer_path.string().c_str());
  if (const double bias = train::largest_expert_bias(native.expert_bias); bias > 0)
    std::printf("warning: %s\n", qwen3::expert_bias_export_warning(bias).c_str());
  const DType dtype = d == "bfloat16" ? DType::BF16 : DType::F32;
  {
    uint64_t total = 0;
    for (auto& r : qwen3::hf_tensors(*native.model)) total += uint64_t(shape_numel(r.shape)) * dtype_size(dtype);
    train::Progress progress("export: writing " + out.string(), total,
                             [&] { return train::bytes_in_temporaries_of(out); });
    qwen3::export_hf_model(*native.model, out, dtype, {files, native.generation_config}, p.has("overwrite"));
  }
  std::printf("exported step %ld to %s (%s, %zu tokenizer files%s)\n", long(native.step),
              p.get("out").c_str(), d.c_str(), files.size(),
              native.generation_config.is_null() ? "" : ", generation_config.json");
  return 0;
}

// Mean next-token loss of `model` on the first batch of `dataset`.
double batch_loss(qwen3::Qwen3Model& model, const data::Batch& batch) {
  autograd::NoGradGuard no_grad;
  Tensor ids = Tensor::from_vector(batch.inputs, {batch.batch_size, batch.seq_len});
  Tensor targets = Tensor::from_vector(batch.labels, {batch.batch_size, batch.seq_len});
  return model.forward_loss(ids, targets).ce_loss.item();
}

int verify_main(int argc, char** argv) {
  ArgParser p("verify-export DIR",
              "Reloads a Hugging Face export through the HF route and checks keys, shapes, dtypes, the tied\n"
              "lm_head, the tokenizer and a finite loss on one batch; then every tensor bit for bit against\n"
              "the native checkpoint it came from (--source) or against the checksums written at export.");
  p.option("source", "native checkpoint folder the export came from (step-N)")
      .option("dataset", "text data for the loss batch (default: the built-in corpus)")
      .option("batch", "batch size of the loss batch", "2")
      .option("seq", "sequence length of the loss batch", "128")
      .takes_positional();
  if (!p.parse(argc, argv)) return 0;
  TITAN_CHECK(p.positional().size() == 1 && !p.positional()[0].empty(),
              "titan verify-export: give exactly one export directory (see --help)");
  const fs::path dir = p.positional()[0];
  // The options are checked before the first row prints.
  const int64_t loss_seq = p.get_int("seq", 1), loss_batch = p.get_int("batch", 1);
  TITAN_CHECK(loss_seq <= (int64_t(1) << 20) && loss_batch <= (int64_t(1) << 24) / loss_seq,
              "titan verify-export: the loss batch --batch ", loss_batch, " x --seq ", loss_seq,
              " is over the bound (seq <= 1048576, batch x seq <= 16777216 tokens)");
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    std::printf("%s  %s\n", ok ? "PASS" : "FAIL", what.c_str());
    failures += !ok;
  };

  // 1. keys, shapes, dtypes: the HF loader reports every mismatch by name.
  std::unique_ptr<qwen3::Qwen3Model> model;
  {
    train::Progress progress("loading " + dir.string(), train::bytes_under(dir));
    model = qwen3::load_hf_model(dir, DType::F32, Device::CPU, qwen3::Purpose::Inference);
  }
  const auto& args = model->args();
  // The loss batch's positions must be the model's: the error names the flag, not the forward's shapes.
  TITAN_CHECK(loss_seq <= args.max_seq_len, "titan verify-export: --seq ", loss_seq, " passes the export's ",
              (dir / "config.json").string(), " max_position_embeddings ", args.max_seq_len,
              ": give --seq of at most that");
  check(true, "keys and shapes match " + std::string(args.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM") +
                  " (" + std::to_string(qwen3::hf_tensors(*model).size()) + " tensors)");
  io::HfCheckpoint ckpt = io::HfCheckpoint::open(dir);
  const std::string dtype_name_cfg =
      qwen3::hf_config_weights_dtype(io::read_json_file(dir / "config.json", "titan verify-export"));
  const std::optional<DType> want = dtype_name_cfg == "float32"    ? std::optional(DType::F32)
                                    : dtype_name_cfg == "bfloat16" ? std::optional(DType::BF16)
                                    : dtype_name_cfg == "float16"  ? std::optional(DType::F16)
                                                                   : std::nullopt;
  std::string other_dtype;  // the first tensor of another dtype
  for (auto& k : ckpt.keys())
    if (other_dtype.empty() && (!want || ckpt.at(k).dtype != *want))
      other_dtype = k + " is " + std::string(dtype_name(ckpt.at(k).dtype));
  check(other_dtype.empty(), "every tensor is " + dtype_name_cfg + " as config.json says" +
                                 (other_dtype.empty() ? "" : " (" + other_dtype + ")"));
  // 2. tied lm_head: absent when tied (transformers re-ties it), present otherwise.
  bool has_head = ckpt.contains("lm_head.weight");
  check(args.tie_embeddings ? !has_head : has_head,
        std::string("lm_head.weight ") + (has_head ? "present" : "absent") + ", tie_word_embeddings = " +
            (args.tie_embeddings ? "true" : "false"));
  // 3. tokenizer files travel with the weights, and load. Without them the loss row cannot run,
  // but the tensors are still checked.
  std::optional<data::Tokenizer> tok;
  if (!fs::exists(dir / "tokenizer.json")) {
    check(false, "tokenizer.json present");
  } else {
    try {
      tok.emplace(data::Tokenizer::load(dir));
      check(true, "tokenizer.json present and loads");
    } catch (const Error& e) {
      check(false, std::string("tokenizer.json present but does not load: ") + e.what());
    }
  }

  // 4. loss on one batch of real text, tokenized with the export's tokenizer.
  if (tok) {
    data::LoaderConfig lc;
    lc.paths = {p.has("dataset") ? fs::path(p.get("dataset")) : data::default_dataset_path()};
    lc.seq_len = loss_seq;
    lc.local_batch_size = loss_batch;
    lc.infinite = false;
    data::TokenLoader loader(lc, *tok);
    data::Batch batch = loader.next();
    if (batch.empty()) {
      // A FAIL row, not a stop: the bit-for-bit row below still runs.
      check(false, "loss on one batch: " + lc.paths[0].string() + " holds fewer than one batch of " +
                       std::to_string(loss_batch) + " x " + std::to_string(loss_seq + 1) +
                       " tokens (lower --batch or --seq)");
    } else {
      double loss = batch_loss(*model, batch);
      check(std::isfinite(loss), "loss on one batch (" + std::to_string(batch.batch_size) + " x " +
                                     std::to_string(batch.seq_len) + " tokens): " + std::to_string(loss));
    }
  } else {
    std::printf("SKIP  loss on one batch: no tokenizer to tokenize it with\n");
  }
  // 5. every tensor bit for bit: against the source checkpoint converted exactly as export converts,
  // or, without --source, against the checksums recorded at export time. A loss comparison would pass
  // a tampered export whose damage moves one batch's loss by less than its tolerance.
  if (p.has("source")) {
    auto native = train::load_native_model(p.get("source"), DType::F32);
    // Another model's checkpoint would only show as "every tensor differs": name the field instead.
    std::string other_model;
    for (const std::string& key : qwen3::override_keys())
      if (other_model.empty() && qwen3::field_text(native.model->args(), key) != qwen3::field_text(args, key))
        other_model = key + " = " + qwen3::field_text(native.model->args(), key) + " in the source, " +
                      qwen3::field_text(args, key) + " in the export";
    if (!other_model.empty()) {
      check(false, "the source is another model (" + other_model + "); its tensors were not compared");
      std::printf("verify-export FAILED: %d check(s) failed\n", failures);
      return 1;
    }
    int64_t differing = 0;
    std::string first;
    for (auto& r : qwen3::hf_tensors(*native.model)) {
      const io::TensorInfo* t = ckpt.find(r.key);
      if (!t) {
        ++differing;
        if (first.empty()) first = r.key + " is missing from the export";
        continue;
      }
      Tensor src = r.value().contiguous();
      std::vector<std::byte> want(size_t(src.numel()) * dtype_size(t->dtype));
      if (t->dtype == DType::BF16)
        convert_f32_to_bf16(src.data<float>(), reinterpret_cast<bf16*>(want.data()), size_t(src.numel()));
      else if (t->dtype == DType::F32)
        std::memcpy(want.data(), src.raw_data(), want.size());
      const auto* got = static_cast<const std::byte*>(t->data);
      if (t->shape != r.shape || t->nbytes() != want.size() ||
          std::memcmp(got, want.data(), want.size()) != 0) {
        ++differing;
        if (first.empty()) {
          size_t at = 0, n = std::min<size_t>(t->nbytes(), want.size());
          while (at < n && got[at] == want[at]) ++at;
          first = r.key + " differs from the source (first at byte " + std::to_string(at) + ")";
        }
      }
    }
    check(differing == 0, differing == 0
                              ? "every tensor equals the source checkpoint bit for bit"
                              : std::to_string(differing) + " tensor(s) differ from the source; " + first);
  } else {
    const fs::path sums_path = dir / io::kTensorChecksumsFile;
    if (!fs::exists(sums_path)) {
      check(false, std::string(io::kTensorChecksumsFile) +
                       " missing: nothing to check the tensors against (pass --source STEP_DIR)");
    } else {
      std::ifstream sf(sums_path);
      nlohmann::json sums = nlohmann::json::parse(sf, nullptr, /*allow_exceptions=*/false);
      int64_t bad = 0, files_checked = 0;
      std::string first;
      auto fail = [&](const std::string& why) {
        ++bad;
        if (first.empty()) first = why;
      };
      // The hash the checksums were computed with: named since 2026-12-01, the older basis before.
      const std::optional<uint64_t> basis =
          !sums.is_object() || !sums.contains("hash") ? fnv1a_basis_named("")
          : sums["hash"].is_string()                  ? fnv1a_basis_named(sums["hash"].get<std::string>())
                                                      : std::nullopt;
      if (!sums.is_object() || !sums.contains("tensors") || !sums["tensors"].is_object()) {
        fail(std::string(io::kTensorChecksumsFile) + " is malformed");
      } else if (!basis) {
        fail(std::string(io::kTensorChecksumsFile) + " names the hash " + sums["hash"].dump() +
             ", which this titan does not know (only \"" + kFnv1aName + "\")");
      } else {
        const auto& listed = sums["tensors"];
        for (auto& k : ckpt.keys())
          if (!listed.contains(k)) fail(k + " is not listed in " + io::kTensorChecksumsFile);
        for (auto& [k, v] : listed.items()) {
          const io::TensorInfo* t = ckpt.find(k);
          if (!t)
            fail(k + " is listed but missing from the export");
          else if (!v.is_object() || !v.contains("checksum") || !v["checksum"].is_string() ||
                   !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
                   !v["shape"].is_array() ||
                   !std::all_of(v["shape"].begin(), v["shape"].end(),
                                [](const nlohmann::json& d) { return d.is_number_integer(); }))
            fail(k + "'s entry in " + io::kTensorChecksumsFile + " is malformed (" + v.dump() + ")");
          else if (v["checksum"].get<std::string>() != io::tensor_checksum(*t, *basis) ||
                   v["dtype"].get<std::string>() != dtype_name(t->dtype) ||
                   v["shape"].get<Shape>() != t->shape)
            fail(k + " does not match its recorded checksum, dtype or shape");
        }
        // The files beside the tensors (listed since 2026-12-02): a config.json edited after the
        // export (rope_theta, rms_norm_eps, ...) loads and computes another model.
        if (sums.contains("files") && sums["files"].is_object())
          for (auto& [name, sum] : sums["files"].items()) {
            const fs::path f = dir / name;
            if (!fs::is_regular_file(f))
              fail(name + " is listed but missing from the export");
            else if (std::ifstream in(f, std::ios::binary);
                     !sum.is_string() ||
                     sum.get<std::string>() !=
                         io::bytes_checksum(std::string(std::istreambuf_iterator<char>(in), {})))
              fail(name + " changed since the export (it does not match its recorded checksum)");
            else
              ++files_checked;
          }
      }
      check(bad == 0,
            bad == 0
                ? "every tensor matches the checksums recorded at export (" +
                      std::to_string(ckpt.keys().size()) + " tensors" +
                      (files_checked ? ", and " + std::to_string(files_checked) + " other files" : "") + ")"
                : std::to_string(bad) + " problem(s) against " + io::kTensorChecksumsFile + "; " + first);
    }
  }
  std::printf("%s: %d check(s) failed\n", failures ? "verify-export FAILED" : "verify-export OK", failures);
  return failures ? 1 : 0;
}

TITAN_COMMAND("export", "write a Hugging Face checkpoint from a native checkpoint", export_main);
TITAN_COMMAND("verify-export", "reload a Hugging Face export and check it against its source", verify_main);

}  // namespace
}  // namespace titan::cli
