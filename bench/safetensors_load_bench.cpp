// Loading a ~1.26 GB safetensors file (random f32 and bf16 tensors, the size of a bf16 0.6B model)
// through titan's mmap reader, next to a plain read() of the same file (what `cat FILE > /dev/null`
// does). Every variant touches every byte (a checksum) except PlainRead, which is cat itself.
//   warm: the file is in the page cache (just written), so this measures the reader, not the disk.
//   cold: posix_fadvise(DONTNEED) drops this file's cached pages first (nothing else's).
// The file goes to $TITAN_BENCH_TMP or <build>/bench_tmp and is deleted at exit.
//   build/bin/safetensors_load_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "titan/core/check.h"
#include "titan/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using titan::DType;
using namespace titan::io;

constexpr int kTensors = 150;
constexpr size_t kTensorBytes = size_t(8) << 20;  // 8 MiB each: 150 x 8 MiB = 1.26 GB

struct BenchFile {
  fs::path path;
  uint64_t size = 0;
  BenchFile() {
    const char* env = std::getenv("TITAN_BENCH_TMP");
    fs::path dir =
        env ? fs::path(env) : fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bench_tmp";
    fs::create_directories(dir);
    path = dir / "safetensors_load_bench.safetensors";
    // 8 distinct random buffers, cycled: enough to keep every tensor's bytes varied.
    std::vector<std::vector<uint64_t>> bufs(8, std::vector<uint64_t>(kTensorBytes / 8));
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (auto& b : bufs)
      for (auto& w : b) {  // xorshift64*
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        w = x * 0x2545F4914F6CDD1Dull;
      }
    std::vector<TensorWrite> ws;
    for (int i = 0; i < kTensors; ++i) {
      bool f32 = i % 2 == 0;
      std::vector<int64_t> shape = f32 ? std::vector<int64_t>{2048, 1024} : std::vector<int64_t>{4096, 1024};
      ws.push_back({"layers." + std::to_string(i / 2) + (f32 ? ".w_f32" : ".w_bf16"),
                    f32 ? DType::F32 : DType::BF16, shape, bufs[size_t(i) % bufs.size()].data()});
    }
    size = write_safetensors(path, ws);
  }
  ~BenchFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

const BenchFile& bench_file() {
  static BenchFile f;
  return f;
}

void drop_cache(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  TITAN_CHECK(fd >= 0, "open ", p);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Sum of 64-bit words (plus a byte tail): touches every byte, cheap enough to stay memory bound.
__attribute__((noinline)) uint64_t checksum(const std::byte* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a += w[0], b += w[1], c += w[2], d += w[3];
  }
  for (; i < n; ++i) a += uint64_t(p[i]);
  return a + b + c + d;
}

void set_rate(benchmark::State& state, uint64_t bytes) {
  state.SetBytesProcessed(int64_t(state.iterations() * bytes));
  state.counters["GB/s"] = benchmark::Counter(double(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

// read() in 128 KiB blocks, discarding the data: cat FILE > /dev/null.
void read_file(const fs::path& p, std::vector<std::byte>& buf, bool sum, uint64_t* acc) {
  int fd = ::open(p.c_str(), O_RDONLY);
  TITAN_CHECK(fd >= 0, "open ", p);
  ssize_t k;
  while ((k = ::read(fd, buf.data(), buf.size())) > 0)
    if (sum) *acc += checksum(buf.data(), size_t(k));
  ::close(fd);
}

void BM_PlainRead(benchmark::State& state) {
  const BenchFile& f = bench_file();
  std::vector<std::byte> buf(128 << 10);
  uint64_t acc = 0;
  for (auto _ : state) {
    if (state.range(0)) {
      state.PauseTiming();
      drop_cache(f.path);
      state.ResumeTiming();
    }
    read_file(f.path, buf, false, &acc);
  }
  set_rate(state, f.size);
}

void BM_ReadChecksum(benchmark::State& state) {
  const BenchFile& f = bench_file();
  std::vector<std::byte> buf(128 << 10);
  uint64_t acc = 0;
  for (auto _ : state) {
    if (state.range(0)) {
      state.PauseTiming();
      drop_cache(f.path);
      state.ResumeTiming();
    }
    read_file(f.path, buf, true, &acc);
    benchmark::DoNotOptimize(acc);
  }
  set_rate(state, f.size);
}

// titan's reader: open (mmap + validate the header) and checksum every tensor in place, no copy.
// advise: 0 = plain page faults, 1 = SafetensorsFile::prefetch() (MADV_WILLNEED, async readahead of
// the whole file), 2 = MADV_POPULATE_READ (prefault every page table entry in one call).
void BM_MmapLoadChecksum(benchmark::State& state) {
  const BenchFile& f = bench_file();
  const bool cold = state.range(0);
  const int64_t advise = state.range(1);
  uint64_t acc = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_cache(f.path);
      state.ResumeTiming();
    }
    SafetensorsFile file = SafetensorsFile::open(f.path);
    if (advise == 1) file.prefetch();
    if (advise == 2)
      ::madvise(const_cast<void*>(file.keep_alive().get()), file.file_size(), MADV_POPULATE_READ);
    for (const TensorInfo& t : file.tensors()) acc += checksum(t.data, t.nbytes());
    benchmark::DoNotOptimize(acc);
  }
  set_rate(state, f.size);
}

BENCHMARK(BM_PlainRead)->ArgName("cold")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadChecksum)->ArgName("cold")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MmapLoadChecksum)
    ->ArgNames({"cold", "advise"})
    ->ArgsProduct({{0, 1}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
