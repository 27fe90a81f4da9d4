#include "titan/train/resume_guard.h"

#include "titan/core/check.h"
#include "titan/data/data_identity.h"
#include "titan/train/checkpoint.h"
#include "titan/train/log.h"

namespace titan::train {
using json = nlohmann::json;

void check_same_model_config(const json& saved, const qwen3::ModelArgs& now, const std::string& checkpoint) {
  const qwen3::ModelArgs was =
      qwen3::args_from_hf_config(saved, checkpoint + "/train_state.json model_config");
  // Every field that differs, in one error.
  std::string trained, here;
  for (const std::string& key : qwen3::override_keys()) {
    if (!qwen3::shapes_the_computation(key)) continue;  // the aux loss weight's change is noted
    const std::string a = qwen3::field_text(was, key), b = qwen3::field_text(now, key);
    if (a == b) continue;
    trained += (trained.empty() ? "model." : ", model.") + key + " = " + a;
    here += (here.empty() ? "model." : ", model.") + key + " = " + b;
  }
  // Untying a tied head (and changing nothing else) is a new run from these weights (its optimizer
  // state has no moments for a head of its own): said as such.
  const bool unties = trained == "model.tie_embeddings = true" && !now.tie_embeddings;
  TITAN_CHECK(trained.empty(), "checkpoint ", checkpoint, " was trained with ", trained,
              " but this run's model has ", here,
              "; resuming would load it into a different model (restore the model config, or use another "
              "job.dump_folder)",
              unties ? "; to untie its head, start a run in another job.dump_folder from its weights only "
                       "(checkpoint.initial_load_path, checkpoint.initial_load_model_only = true): the head "
                       "starts as a copy of the embedding"
                     : "");
}

void check_same_seq_len(const json& saved, int64_t seq_len, const std::string& checkpoint) {
  if (saved.contains("seq_len") && saved["seq_len"].is_number_integer())
    TITAN_CHECK(saved["seq_len"].get<int64_t>() == seq_len, "checkpoint ", checkpoint,
                " was trained with training.seq_len = ", saved["seq_len"].get<int64_t>(),
                " but this run has ", seq_len,
                ": its data position counts windows of the old length (set "
                "checkpoint.restart_data_stream = true to start the data from the beginning)");
}

data::DatasetComparison check_resumable_dataset(const json& ts, const json& identity,
                                                const std::string& checkpoint) {
  TITAN_CHECK(ts.contains("dataset_identity"), "checkpoint ", checkpoint,
              " records no dataset identity, so its data position cannot be checked against this run's "
              "dataset; set checkpoint.restart_data_stream = true to start the data from the beginning");
  const data::DatasetComparison compared = data::compare_dataset_identity(ts["dataset_identity"], identity);
  TITAN_CHECK(
      compared.mismatch.empty(), "checkpoint ", checkpoint,
      " was trained on a different dataset: ", compared.mismatch,
      "; its data position would land in the middle of other data (set checkpoint.restart_data_stream "
      "= true to start this dataset from its beginning)");
  const json& saved = ts.at("dataloader");
  // A position in a grown file lies within the bytes the checkpoint recorded of it (its identity is
  // taken at the run's start): one past them means the file grew while that run read it, and what it
  // read there no fingerprint covered.
  // (A best-fit state inside a window read on to where the window ended: that position too.)
  std::vector<std::pair<const char*, data::DocPosition>> read_to = {
      {"data position", saved.at("doc").get<data::DocPosition>()}};
  if (saved.contains("window_end"))
    read_to.push_back({"best-fit window's end", saved.at("window_end").get<data::DocPosition>()});
  for (const auto& [what, at] : read_to)
    for (const data::DatasetComparison::GrownFile& grown : compared.grown_files)
      TITAN_CHECK(
          at.file != grown.index || at.offset <= grown.old_bytes, "checkpoint ", checkpoint, ": its ", what,
          ", byte ", at.offset, " of '", identity[grown.index].value("path", "?"), "', lies past the ",
          grown.old_bytes,
          " bytes it recorded of that file: the file grew while that run read it, and what it read past "
          "them no fingerprint covered (set checkpoint.restart_data_stream = true to start the data from "
          "the beginning)");
  // Best-fit packing plans the window a checkpoint stopped in again from the data: a state that does
  // not say where that window ended (before 2026-12-08) cannot show that a grown dataset left it as it
  // was.
  TITAN_CHECK(
      compared.growth.empty() || saved.value("rows_taken", uint64_t(0)) == 0 || saved.contains("window_end"),
      "checkpoint ", checkpoint,
      " stopped inside a best-fit window of conversations and does not record "
      "where that window ended, so a dataset that grew cannot be shown to leave it as it was (",
      compared.growth,
      "): resume on the dataset as it was until a later checkpoint, or set checkpoint.restart_data_stream = "
      "true to start the data from the beginning");
  return compared;
}

std::string check_same_tokenizer(const json& ts, const std::filesystem::path& tokenizer_path,
                                 bool restart_data_stream, const std::string& checkpoint) {
  // Another tokenizer turns the same text into other ids: the saved data position counts tokens of
  // the old one, and the model learned the old ids. (Checkpoints before 2026-12-02 record no checksum.)
  if (!ts.contains("tokenizer_checksum") || ts["tokenizer_checksum"] == tokenizer_checksum(tokenizer_path))
    return "";
  const std::string what = "the tokenizer '" + tokenizer_path.string() +
                           "' is not the one the checkpoint was trained with ('" +
                           ts.value("tokenizer_path", std::string("?")) + "': tokenizer.json differs)";
  TITAN_CHECK(
      restart_data_stream, "checkpoint: '", checkpoint, "': ", what,
      ": its data position counts tokens of the other tokenizer, and the model learned the other ids. "
      "Use the same tokenizer (model.hf_assets_path), or set checkpoint.restart_data_stream = true to "
      "go on from the start of the data with this one");
  return "note: " + what + "; checkpoint.restart_data_stream = true: the data starts over, tokenized with it";
}

std::vector<std::string> restore_data_position(data::TokenLoader& loader, const json& ts,
                                               const json& identity, bool restart_data_stream,
                                               const std::string& checkpoint) {
  if (restart_data_stream)
    return {"data: checkpoint.restart_data_stream = true: the data stream starts from the beginning of " +
            counted(int64_t(identity.size()), "file")};
  const data::DatasetComparison compared = check_resumable_dataset(ts, identity, checkpoint);
  const json& saved = ts.at("dataloader");
  check_same_seq_len(saved, loader.config().seq_len, checkpoint);
  if (saved.contains("eos_id") && saved["eos_id"].is_number_integer())
    TITAN_CHECK(
        saved["eos_id"].get<int32_t>() == loader.config().eos_id, "checkpoint ", checkpoint,
        " ended its documents with token id ", saved["eos_id"].get<int32_t>(),
        " but this run ends them with ", loader.config().eos_id,
        " (training.document_separator): its data position counts windows of the other token stream (set "
        "training.document_separator back, or checkpoint.restart_data_stream = true to start the data from "
        "the beginning)");
  // Only a dataset with plain-text files is cut by text_split ("" in the state when it has none).
  const std::string saved_split = saved.value("text_split", std::string());
  const std::string split = loader.state().value("text_split", std::string());
  TITAN_CHECK(saved_split.empty() || split.empty() || saved_split == split, "checkpoint ", checkpoint,
              " cut plain-text files into ", saved_split,
              " documents but this run has training.text_split = ", split,
              ": its data position counts other documents (set training.text_split back, or "
              "checkpoint.restart_data_stream = true to start the data from the beginning)");
  // A position inside a document counts tokens of the field it was read from.
  const std::string saved_field = saved.value("text_field", std::string());
  const std::string field = loader.state().value("text_field", std::string());
  TITAN_CHECK(saved_field.empty() || field.empty() || saved_field == field, "checkpoint ", checkpoint,
              " read its documents from the field '", saved_field,
              "' but this run has training.text_field = \"", field,
              "\": its data position counts other documents' tokens (set training.text_field back, or "
              "checkpoint.restart_data_stream = true to start the data from the beginning)");
  // A data position counts conversations (one per row or packed alike) or text documents.
  const auto reading = [](const std::string& chat_field) {
    return chat_field.empty() ? std::string("packed text documents")
                              : "conversations (training.chat_field = \"" + chat_field + "\")";
  };
  const std::string saved_chat = saved.value("chat_field", std::string());
  TITAN_CHECK(saved_chat == loader.config().chat_field, "checkpoint ", checkpoint, " read its data as ",
              reading(saved_chat), " but this run reads ", reading(loader.config().chat_field),
              ": its data position counts other rows (set training.chat_field back, or "
              "checkpoint.restart_data_stream = true to start the data from the beginning)");
  // Conversations: a position between best-fit windows, or next-fit's (the next conversation to
  // place), is where any packing can go on; one inside a window is best-fit's of that window size.
  const auto packing = [](const std::string& p) {
    return p.empty() ? std::string("next-fit in dataset order (or one per row)")
                     : "best-fit over windows of " + p.substr(p.find(' ') + 1) + " conversations";
  };
  const std::string saved_packing = saved.value("packing", std::string()),
                    now_packing = loader.state().value("packing", std::string());
  const uint64_t rows_taken = saved.value("rows_taken", uint64_t(0));
  TITAN_CHECK(
      rows_taken == 0 || saved_packing == now_packing, "checkpoint ", checkpoint, " stopped after ",
      rows_taken, " rows of a window packed ", packing(saved_packing), ", but this run packs ",
      packing(now_packing),
      ": the window's other rows exist only in the saved packing (set training.pack_strategy and "
      "training.pack_window back, or checkpoint.restart_data_stream = true to start the data from the "
      "beginning)");
  try {
    loader.restore(saved);
  } catch (const Error& e) {
    TITAN_FAIL("checkpoint ", checkpoint, ": ", e.what(),
               " (where the dataset changed: resume on it as it was, or set checkpoint.restart_data_stream = "
               "true to start the data from the beginning)");
  }
  std::vector<std::string> notes;
  if (!compared.growth.empty())
    notes.push_back("data: the dataset grew since checkpoint " + checkpoint + ": " + compared.growth +
                    "; the data goes on from its position and reaches what was added in dataset order (lines "
                    "appended to a file it has passed, in the next pass over the data)");
  if (saved_packing != now_packing && !saved_chat.empty())
    notes.push_back("data: conversations were packed " + packing(saved_packing) + " up to checkpoint " +
                    checkpoint + "; from its data position on they are packed " + packing(now_packing));
  return notes;
}

json resumable_settings(const JobConfig& c, const qwen3::ModelArgs& args) {
  json settings = {{"optimizer.name", c.optimizer.name},
                   {"optimizer.beta1", c.optimizer.beta1},
                   {"optimizer.beta2", c.optimizer.beta2},
                   {"optimizer.eps", c.optimizer.eps},
                   {"optimizer.weight_decay", c.optimizer.weight_decay},
                   {"training.max_norm", c.training.max_norm},
                   {"training.mixed_precision_param", c.training.mixed_precision_param},
                   {"training.mixed_precision_reduce", c.training.mixed_precision_reduce},
                   {"training.activation_grad_dtype", c.training.activation_grad_dtype},
                   {"training.load_balance", c.training.load_balance},
                   {"training.load_balance_coeff", c.training.load_balance_coeff},
                   {"model.router_aux_loss_coef", args.router_aux_loss_coef},
                   {"model.pad_token_id", args.pad_token_id},
                   {"training.seed", c.training.seed},
                   {"model.init", c.model.init}};
  // transformers' aux loss balances the experts over one micro-batch's tokens: another micro-batch
  // shape trains another objective, though every other setting stays.
  if (args.is_moe() && c.training.load_balance == "aux_loss") {
    settings["training.local_batch_size"] = c.training.local_batch_size;
    settings["training.seq_len"] = c.training.seq_len;
  }
  return settings;
}

json recorded_settings(const json& train_state) {
  json settings = train_state.value("settings", json::object());
  const json model = train_state.value("model_config", json::object());
  if (settings.is_object() && !settings.contains("model.router_aux_loss_coef") && model.is_object() &&
      model.contains("router_aux_loss_coef"))
    settings["model.router_aux_loss_coef"] = model["router_aux_loss_coef"];
  // Every checkpoint's model config holds the pad id (null: none), where its settings may not.
  if (settings.is_object() && !settings.contains("model.pad_token_id") && model.is_object())
    settings["model.pad_token_id"] =
        model.contains("pad_token_id") && model["pad_token_id"].is_number_integer() ? model["pad_token_id"]
                                                                                    : json(-1);
  return settings;
}

std::string changed_settings(const json& saved, const json& now) {
  std::string out;
  // Keys that joined the settings after a checkpoint was written: its run had their default.
  const json defaults = {{"training.mixed_precision_reduce", "float32"},
                         {"training.activation_grad_dtype", "float32"}};
  for (auto& [key, value] : now.items()) {
    if (!saved.is_object()) continue;
    const json before = saved.contains(key) ? saved[key] : defaults.value(key, json());
    if (before.is_null() || before == value) continue;
    out += (out.empty() ? "" : ", ") + key + " " + before.dump() + " -> " + value.dump();
    if (key == "training.seed" || key == "model.init")
      out += " (no effect: the weights are the checkpoint's)";
    // What the lookup does (a tied head still gives that row its gradient).
    if (key == "model.pad_token_id")
      out += value.get<int64_t>() < 0
                 ? " (transformers' padding_idx: from here the embedding lookup gives every row its gradient)"
                 : " (transformers' padding_idx: from here the embedding lookup gives row " + value.dump() +
                       " no gradient)";
    if (key == "training.local_batch_size" || key == "training.seq_len")
      out +=
          " (the aux loss balances the experts over each micro-batch's tokens: over other tokens from here)";
  }
  return out;
}

}  // namespace titan::train
