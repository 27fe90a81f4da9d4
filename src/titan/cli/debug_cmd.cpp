// titan debug dump: one forward + backward of a Hugging Face checkpoint on given token ids,
// writing logits, loss, aux_loss and every parameter gradient under its HF key. This is
// how a user compares titan.cpp with transformers or any other reference.
#include <cstdio>
#include <cstring>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/suggest.h"
#include "titan/io/path_guard.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/reference_pass.h"
#include "titan/models/qwen3/state_dict.h"

namespace titan::cli {
namespace {

int debug_dump(int argc, char** argv) {
  ArgParser p("debug dump",
              "Runs forward and backward (labels = input_ids, shifted as transformers does) and writes logits,\n"
              "loss, aux_loss (MoE) and grad.<hf key> for every parameter, all f32.");
  p.required("model-path", "Hugging Face checkpoint directory (config.json + safetensors)")
      .required("tokens", "safetensors file holding input_ids, int64 [B, S]")
      .required("out", "output safetensors file")
      .option("dtype", "compute dtype: float32 | bfloat16", "float32");
  if (!p.parse(argc, argv)) return 0;
  DType dtype = dtype_from_name(p.get("dtype"));
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "--dtype must be float32 or bfloat16, got ", p.get("dtype"));

  io::check_output_file(p.get("out"), {p.get("tokens"), p.get("model-path")}, "titan debug dump --out");
  auto tokens_file = io::SafetensorsFile::open(p.get("tokens"));
  const io::TensorInfo& ids_info = tokens_file.at("input_ids");
  TITAN_CHECK(ids_info.dtype == DType::I64 && ids_info.shape.size() == 2, p.get("tokens"),
              ": input_ids must be int64 [B, S], got ", dtype_name(ids_info.dtype), shape_str(ids_info.shape));
  // The loss is over shifted labels: a row needs a second token to have a target (transformers gives
  // NaN for none; a loss of 0 would look like a perfect model).
  TITAN_CHECK(ids_info.shape[0] >= 1 && ids_info.shape[1] >= 2, p.get("tokens"), ": input_ids ",
              shape_str(ids_info.shape),
              " needs B >= 1 rows of S >= 2 tokens (the loss predicts token t+1 from t)");
  Tensor ids = Tensor::empty(ids_info.shape, DType::I64);
  std::memcpy(ids.raw_data(), ids_info.data, ids_info.nbytes());

  auto model = qwen3::load_hf_model(p.get("model-path"), dtype);
  // An id past the vocabulary would otherwise fail deep in the embedding, naming neither file.
  const int64_t vocab = model->args().vocab_size;
  const int64_t* id = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    TITAN_CHECK(id[i] >= 0 && id[i] < vocab, p.get("tokens"), ": input_ids[", i / ids_info.shape[1], "][",
                i % ids_info.shape[1], "] = ", id[i], " is outside the vocabulary of ", p.get("model-path"),
                " [0, ", vocab, ")");

  qwen3::ReferencePass r = qwen3::run_reference_pass(*model, ids);

  std::vector<io::TensorWrite> writes;
  std::vector<Tensor> keep;
  auto add = [&](const std::string& name, const Tensor& t) {
    Tensor c = t.detach().contiguous().to(DType::F32);
    keep.push_back(c);
    writes.push_back({name, DType::F32, c.shape(), c.raw_data()});
  };
  add("logits", r.logits);
  add("loss", r.loss.reshape({}));
  if (r.aux_loss.defined()) add("aux_loss", r.aux_loss.reshape({}));
  for (auto& r : qwen3::hf_tensors(*model)) add("grad." + r.key, r.grad());
  io::write_safetensors(p.get("out"), writes);
  std::printf("loss %.7f%s -> %s (%zu tensors)\n", r.loss.item(),
              r.aux_loss.defined() ? (" aux_loss " + std::to_string(r.aux_loss.item())).c_str() : "",
              p.get("out").c_str(), writes.size());
  return 0;
}

int debug_main(int argc, char** argv) {
  std::string sub = argc >= 2 ? argv[1] : "";
  if (sub == "dump") return debug_dump(argc - 1, argv + 1);
  const bool help = sub == "--help" || sub == "-h";
  if (!help)
    std::fprintf(stderr, "titan debug: %s\n",
                 sub.empty() ? "a subcommand is needed"
                             : ("unknown subcommand '" + sub + "'" + suggestion(sub, {"dump"})).c_str());
  std::fprintf(stderr,
               "usage: titan debug dump --model-path DIR --tokens IN.safetensors --out OUT.safetensors "
               "[--dtype float32|bfloat16]\n");
  return help ? 0 : 2;
}

TITAN_COMMAND("debug", "debug tools: `debug dump` writes logits, loss and gradients for given tokens", debug_main);

}  // namespace
}  // namespace titan::cli
