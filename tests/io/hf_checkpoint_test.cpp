// Hugging Face checkpoint directories: single file and sharded, reading, writing, index validation.
#include "titan/io/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <numeric>

#include "io_test_util.h"

namespace titan::io {
namespace {

namespace fs = std::filesystem;
using namespace titan::io::testing;
using nlohmann::json;

// n tensors of f32, tensor i has 10*(i+1) elements with values i*1000 + k.
struct Model {
  std::vector<std::vector<float>> data;
  std::vector<TensorWrite> writes;
  explicit Model(int n) {
    for (int i = 0; i < n; ++i) {
      data.emplace_back(size_t(10 * (i + 1)));
      std::iota(data.back().begin(), data.back().end(), float(i * 1000));
    }
    for (int i = 0; i < n; ++i)
      writes.push_back({"model.layers." + std::to_string(i) + ".weight",
                        DType::F32,
                        {int64_t(data[i].size())},
                        data[i].data()});
  }
};

void expect_same_tensors(const HfCheckpoint& ck, const Model& m) {
  ASSERT_EQ(ck.size(), m.writes.size());
  for (size_t i = 0; i < m.writes.size(); ++i) {
    const TensorInfo& t = ck.at(m.writes[i].name);
    EXPECT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(t.shape, m.writes[i].shape);
    ASSERT_EQ(t.nbytes(), m.data[i].size() * 4);
    EXPECT_EQ(std::memcmp(t.data, m.data[i].data(), t.nbytes()), 0) << t.name;
  }
}

// Only `dir` itself in its parent: no temporary or backup directory left over.
void expect_no_leftovers(const fs::path& parent, size_t expected_entries) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(parent)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    ++n;
  }
  EXPECT_EQ(n, expected_entries);
}

TEST(HfCheckpoint, OpensTransformersOracle) {
  fs::path dir = titan::testing::fixtures_dir() / "oracles/hf-transformers-5.17/tiny_dense";
  ASSERT_TRUE(fs::exists(dir)) << "missing fixture " << dir;
  EXPECT_TRUE(is_hf_checkpoint_dir(dir));
  HfCheckpoint ck = HfCheckpoint::open(dir);
  EXPECT_FALSE(ck.sharded());
  json ref = python_reference({dir / "model.safetensors"})[(dir / "model.safetensors").string()]["tensors"];
  std::vector<std::string> ref_keys;
  for (const auto& [k, v] : ref.items()) ref_keys.push_back(k);
  EXPECT_EQ(ck.keys(), ref_keys);  // both sorted
  EXPECT_TRUE(ck.contains("model.embed_tokens.weight"));
  EXPECT_FALSE(ck.contains("lm_head.weight"));  // tied checkpoint
  EXPECT_EQ(ck.at("model.norm.weight").shape, std::vector<int64_t>{64});
  expect_error([&] { ck.at("lm_head.weight"); }, {"tiny_dense", "'lm_head.weight'"});
}

TEST(HfCheckpoint, SmallModelIsOneFile) {
  fs::path parent = titan::testing::temp_dir("hf_single");
  Model m(3);
  HfWriteOptions opt;
  opt.extra_files["config.json"] = "{\"model_type\": \"qwen3\"}\n";
  HfWriteResult r = write_hf_checkpoint(parent / "ck", m.writes, opt);
  EXPECT_EQ(r.files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(r.total_size, (10 + 20 + 30) * 4u);
  EXPECT_FALSE(fs::exists(parent / "ck" / kHfIndexFile));
  EXPECT_EQ(read_bytes(parent / "ck/config.json"), opt.extra_files["config.json"]);
  HfCheckpoint ck = HfCheckpoint::open(parent / "ck");
  EXPECT_FALSE(ck.sharded());
  expect_same_tensors(ck, m);
  expect_no_leftovers(parent, 1);
}

TEST(HfCheckpoint, ShardsAboveTheLimitWithIndex) {
  fs::path parent = titan::testing::temp_dir("hf_sharded");
  Model m(6);  // 40, 80, 120, 160, 200, 240 bytes
  fs::path tok = parent / "tokenizer.json";
  write_bytes(tok, "{\"v\": 1}");
  HfWriteOptions opt;
  opt.max_shard_bytes = 200;
  opt.metadata = {{"producer", "titan"}};
  opt.copy_files = {tok};
  HfWriteResult r = write_hf_checkpoint(parent / "ck", m.writes, opt);
  // Greedy in order: [40,80] [120] [160] [200] [240 alone: larger than the limit]
  std::vector<std::string> expect_files;
  for (int i = 1; i <= 5; ++i)
    expect_files.push_back("model-0000" + std::to_string(i) + "-of-00005.safetensors");
  EXPECT_EQ(r.files, expect_files);
  EXPECT_EQ(read_bytes(parent / "ck/tokenizer.json"), "{\"v\": 1}");

  json index = json::parse(read_bytes(parent / "ck" / kHfIndexFile));
  EXPECT_EQ(index["metadata"]["total_size"], 840);
  EXPECT_EQ(index["weight_map"].size(), 6u);
  EXPECT_EQ(index["weight_map"]["model.layers.1.weight"], expect_files[0]);
  EXPECT_EQ(index["weight_map"]["model.layers.5.weight"], expect_files[4]);

  HfCheckpoint ck = HfCheckpoint::open(parent / "ck");
  EXPECT_TRUE(ck.sharded());
  EXPECT_EQ(ck.files().size(), 5u);
  EXPECT_EQ(ck.index_metadata().at("total_size"), "840");
  expect_same_tensors(ck, m);
  EXPECT_EQ(ck.file_of("model.layers.3.weight").path().filename(), expect_files[2]);
  for (const auto& f : ck.files()) EXPECT_EQ(f.metadata().at("producer"), "titan");
  expect_no_leftovers(parent, 2);  // ck and tokenizer.json
}

// Tensors whose bytes come from `fetch` as the writer reaches them (each once, in order, across the
// shards), one buffer reused for all of them: the checkpoint given every tensor's data up front,
// byte for byte; a fetch that gives nothing is an error naming the tensor.
TEST(HfCheckpoint, FetchedTensorsAreWrittenAsGiven) {
  fs::path parent = titan::testing::temp_dir("hf_fetched");
  Model m(6);
  HfWriteOptions opt;
  opt.max_shard_bytes = 200;
  write_hf_checkpoint(parent / "given", m.writes, opt);
  std::vector<size_t> fetched;
  std::vector<float> buffer;  // a tensor's bytes live only until the next one's are asked for
  std::vector<TensorWrite> lazy = m.writes;
  for (size_t i = 0; i < lazy.size(); ++i) {
    lazy[i].data = nullptr;
    lazy[i].fetch = [&, i]() -> const void* {
      fetched.push_back(i);
      buffer = m.data[i];
      return buffer.data();
    };
  }
  write_hf_checkpoint(parent / "fetched", lazy, opt);
  EXPECT_EQ(fetched, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(parent / "given"))
    files.push_back(e.path().filename().string());
  EXPECT_EQ(files.size(), 7u) << "5 shards, the index and the checksums";
  for (const std::string& f : files)
    EXPECT_EQ(titan::testing::file_difference(parent / "given" / f, parent / "fetched" / f), "") << f;
  lazy[2].fetch = [] { return static_cast<const void*>(nullptr); };
  expect_error([&] { write_hf_checkpoint(parent / "empty", lazy, opt); },
               {"model.layers.2.weight", "its fetch gave no data"});
  EXPECT_FALSE(fs::exists(parent / "empty"));
}

TEST(HfCheckpoint, WriteIsAtomic) {
  fs::path parent = titan::testing::temp_dir("hf_atomic");
  Model m(2), m2(3);
  write_hf_checkpoint(parent / "ck", m.writes);
  // Refuses to overwrite unless asked, leaving the old checkpoint untouched.
  expect_error([&] { write_hf_checkpoint(parent / "ck", m2.writes); }, {"already exists"});
  expect_same_tensors(HfCheckpoint::open(parent / "ck"), m);
  // A failure half-way (second tensor cannot be converted) leaves neither a checkpoint nor debris.
  std::vector<TensorWrite> bad = m.writes;
  bad[1].dtype = DType::I64;
  bad[1].source_dtype = DType::F32;
  HfWriteOptions shard_each;
  shard_each.max_shard_bytes = 1;
  expect_error([&] { write_hf_checkpoint(parent / "new", bad, shard_each); }, {"cannot convert f32 to i64"});
  EXPECT_FALSE(fs::exists(parent / "new"));
  expect_no_leftovers(parent, 1);
  // Overwrite replaces the whole directory: the old sharded layout's files are gone.
  write_hf_checkpoint(parent / "sharded", m.writes, shard_each);
  HfWriteOptions ow;
  ow.overwrite = true;
  write_hf_checkpoint(parent / "sharded", m2.writes, ow);
  EXPECT_FALSE(fs::exists(parent / "sharded" / kHfIndexFile));
  expect_same_tensors(HfCheckpoint::open(parent / "sharded"), m2);
  expect_no_leftovers(parent, 2);
}

TEST(HfCheckpoint, WriterRejectsBadInput) {
  fs::path parent = titan::testing::temp_dir("hf_write_bad");
  Model m(2);
  std::vector<TensorWrite> dup = {m.writes[0], m.writes[0]};
  HfWriteOptions shard_each;
  shard_each.max_shard_bytes = 1;
  expect_error([&] { write_hf_checkpoint(parent / "a", dup, shard_each); }, {"duplicate tensor name"});
  HfWriteOptions opt;
  opt.extra_files["model.safetensors"] = "x";
  expect_error([&] { write_hf_checkpoint(parent / "a", m.writes, opt); }, {"collides"});
  opt.extra_files = {{std::string(kHfIndexFile), "{}"}};
  expect_error([&] { write_hf_checkpoint(parent / "a", m.writes, opt); }, {"collides"});
  opt.extra_files = {{"../escape", "x"}};
  expect_error([&] { write_hf_checkpoint(parent / "a", m.writes, opt); }, {"plain file name"});
  expect_no_leftovers(parent, 0);
}

class HfIndexValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = titan::testing::temp_dir(
        "hf_index_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    HfWriteOptions opt;
    opt.max_shard_bytes = 100;
    write_hf_checkpoint(dir / "ck", model.writes, opt);  // shards: [40] [80] [120]
    ck = dir / "ck";
    index = json::parse(read_bytes(ck / kHfIndexFile));
  }
  void write_index(const std::string& text) { write_bytes(ck / kHfIndexFile, text); }
  void write_index() { write_index(index.dump()); }
  Model model{3};
  fs::path dir, ck;
  json index;
};

TEST_F(HfIndexValidation, ValidAsWritten) {
  expect_same_tensors(HfCheckpoint::open(ck), model);
}

TEST_F(HfIndexValidation, MissingShardFile) {
  fs::remove(ck / "model-00002-of-00003.safetensors");
  expect_error([&] { HfCheckpoint::open(ck); },
               {kHfIndexFile.data(), "'model-00002-of-00003.safetensors'", "does not exist"});
}

TEST_F(HfIndexValidation, KeyMappedToShardWithoutIt) {
  index["weight_map"]["model.layers.0.weight"] = "model-00002-of-00003.safetensors";
  write_index();
  expect_error([&] { HfCheckpoint::open(ck); }, {"'model.layers.0.weight'", "which has no such tensor"});
}

TEST_F(HfIndexValidation, ShardTensorNotInIndex) {
  float extra[2] = {1, 2};
  write_safetensors(ck / "model-00001-of-00003.safetensors",
                    std::vector<TensorWrite>{model.writes[0], {"extra.weight", DType::F32, {2}, extra}});
  expect_error([&] { HfCheckpoint::open(ck); },
               {"'model-00001-of-00003.safetensors'", "'extra.weight'", "weight_map does not list"});
}

TEST_F(HfIndexValidation, TensorInTwoShards) {
  write_safetensors(ck / "model-00001-of-00003.safetensors",
                    std::vector<TensorWrite>{model.writes[0], model.writes[1]});
  expect_error(
      [&] { HfCheckpoint::open(ck); },
      {"'model.layers.1.weight' is in shard 'model-00001-of-00003.safetensors'", "maps it to 'model-00002"});
}

TEST_F(HfIndexValidation, ExtraKeyInIndex) {
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors";
  write_index();
  expect_error([&] { HfCheckpoint::open(ck); }, {"'lm_head.weight'", "no such tensor"});
}

TEST_F(HfIndexValidation, MalformedIndex) {
  write_index("{\"weight_map\": ");
  expect_error([&] { HfCheckpoint::open(ck); }, {kHfIndexFile.data(), "not valid JSON"});
  write_index(R"({"metadata": {}})");
  expect_error([&] { HfCheckpoint::open(ck); }, {"missing object 'weight_map'"});
  write_index(R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})");
  expect_error([&] { HfCheckpoint::open(ck); }, {"duplicate key 'a'"});
  write_index(R"({"weight_map": {"a": "../ck/model-00001-of-00003.safetensors"}})");
  expect_error([&] { HfCheckpoint::open(ck); }, {"not a plain file name"});
  write_index(R"({"weight_map": {"a": 3}})");
  expect_error([&] { HfCheckpoint::open(ck); }, {"weight_map['a'] must be a file name"});
  write_index(R"({"metadata": {"total_size": -1}, "weight_map": {}})");
  expect_error([&] { HfCheckpoint::open(ck); }, {"total_size"});
  write_index(R"({"weight_map": {}, "extra": 1})");
  expect_error([&] { HfCheckpoint::open(ck); }, {"unknown field 'extra'"});
}

TEST_F(HfIndexValidation, CorruptShardIsNamed) {
  fs::path shard = ck / "model-00003-of-00003.safetensors";
  std::string bytes = read_bytes(shard);
  write_bytes(shard, bytes.substr(0, bytes.size() - 4));
  expect_error([&] { HfCheckpoint::open(ck); }, {"model-00003-of-00003.safetensors", "past the end"});
}

TEST_F(HfIndexValidation, AmbiguousOrEmptyDirectory) {
  write_bytes(ck / kHfSingleFile, read_bytes(ck / "model-00001-of-00003.safetensors"));
  expect_error([&] { HfCheckpoint::open(ck); }, {"holds both", "ambiguous"});
  fs::create_directories(dir / "empty");
  EXPECT_FALSE(is_hf_checkpoint_dir(dir / "empty"));
  expect_error([&] { HfCheckpoint::open(dir / "empty"); }, {"holds neither"});
  expect_error([&] { HfCheckpoint::open(dir / "nope"); }, {"does not exist"});
}

}  // namespace
}  // namespace titan::io
