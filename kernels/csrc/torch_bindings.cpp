// Torch entry points of the blocksim kernels. The Python layer (kernels/*/ops.py) validates shapes,
// dtypes, devices and block ids before calling these; the checks here only guard the raw
// pointers handed to the launchers. Each entry point takes the CUDA stream to launch on as an
// integer handle (torch.cuda.current_stream().cuda_stream), so that this file needs only the
// CPU parts of the torch headers.
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "cache_ops.h"
#include "fast_decode.h"
#include "paged_attention.h"
#include "paged_prefill.h"

namespace {

// Makes `device` current for the scope of a call and restores the previous device after.
class DeviceScope {
 public:
  explicit DeviceScope(const torch::Device& device) {
    cudaGetDevice(&previous_);
    if (device.index() != previous_) cudaSetDevice(device.index());
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

cudaStream_t as_stream(int64_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

void check_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
}

// Checks and fields common to the vLLM-layout and the fast kernels' parameter structs (both name
// them alike): the tensors on CUDA, int32 tables and lengths, contiguous output and query rows;
// pointers, ALiBi slopes, scale, sizes and the query stride.
template <typename Params>
void fill_common(Params& p, const char* what, torch::Tensor& out, const torch::Tensor& query,
                 const torch::Tensor& key_cache, const torch::Tensor& value_cache, int64_t num_kv_heads, double scale,
                 const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                 const std::optional<torch::Tensor>& alibi_slopes) {
  const torch::Tensor& out_ = out;
  for (const torch::Tensor* t : {&out_, &query, &key_cache, &value_cache, &block_tables, &context_lens}) {
    check_cuda(*t, what);
  }
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "block_tables must be contiguous int32");
  TORCH_CHECK(context_lens.scalar_type() == torch::kInt32 && context_lens.is_contiguous(),
              "context_lens must be contiguous int32");
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  TORCH_CHECK(query.stride(2) == 1 && query.stride(1) == query.size(2), "query rows must be contiguous");
  p.out = out.data_ptr();
  p.query = query.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.block_tables = block_tables.data_ptr<int>();
  p.context_lens = context_lens.data_ptr<int>();
  if (alibi_slopes.has_value()) {
    check_cuda(*alibi_slopes, "alibi_slopes");
    TORCH_CHECK(alibi_slopes->scalar_type() == torch::kFloat32 && alibi_slopes->is_contiguous(),
                "alibi_slopes must be contiguous float32");
    p.alibi_slopes = alibi_slopes->data_ptr<float>();
  }
  p.scale = static_cast<float>(scale);
  p.num_seqs = static_cast<int>(query.size(0));
  p.num_heads = static_cast<int>(query.size(1));
  p.head_size = static_cast<int>(query.size(2));
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.max_blocks_per_seq = static_cast<int>(block_tables.size(1));
  p.num_blocks = static_cast<int>(key_cache.size(0));
  p.q_stride = query.stride(0);
}

blocksim::AttentionParams attention_params(torch::Tensor& out, const torch::Tensor& query,
                                           const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                                           int64_t num_kv_heads, double scale, const torch::Tensor& block_tables,
                                           const torch::Tensor& context_lens, int64_t block_size,
                                           int64_t max_context_len,
                                           const std::optional<torch::Tensor>& alibi_slopes) {
  blocksim::AttentionParams p{};
  fill_common(p, "every paged_attention tensor", out, query, key_cache, value_cache, num_kv_heads, scale,
              block_tables, context_lens, alibi_slopes);
  p.block_size = static_cast<int>(block_size);
  p.max_context_len = static_cast<int>(max_context_len);
  p.k_block_stride = key_cache.stride(0);
  p.k_head_stride = key_cache.stride(1);
  p.v_block_stride = value_cache.stride(0);
  p.v_head_stride = value_cache.stride(1);
  return p;
}

cudaError_t launch_typed(const blocksim::AttentionParams& p, torch::ScalarType dtype, int version,
                         cudaStream_t stream) {
  switch (dtype) {
    case torch::kFloat32: return blocksim::launch_paged_attention_f32(p, version, stream);
    case torch::kFloat16: return blocksim::launch_paged_attention_f16(p, version, stream);
    case torch::kBFloat16: return blocksim::launch_paged_attention_bf16(p, version, stream);
    default: TORCH_CHECK(false, "unsupported dtype ", dtype);
  }
}

void paged_attention_v1(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                        int64_t num_kv_heads, double scale, torch::Tensor block_tables,
                        torch::Tensor context_lens, int64_t block_size, int64_t max_context_len,
                        std::optional<torch::Tensor> alibi_slopes, int64_t stream) {
  auto p = attention_params(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, context_lens,
                            block_size, max_context_len, alibi_slopes);
  const DeviceScope scope(query.device());
  check_launch(launch_typed(p, query.scalar_type(), 1, as_stream(stream)), "paged_attention_v1");
}

void paged_attention_v2(torch::Tensor out, torch::Tensor exp_sums, torch::Tensor max_logits, torch::Tensor tmp_out,
                        torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                        int64_t num_kv_heads, double scale, torch::Tensor block_tables,
                        torch::Tensor context_lens, int64_t block_size, int64_t max_context_len,
                        std::optional<torch::Tensor> alibi_slopes, int64_t stream) {
  auto p = attention_params(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, context_lens,
                            block_size, max_context_len, alibi_slopes);
  const int64_t parts = (max_context_len + blocksim::kPartitionSize - 1) / blocksim::kPartitionSize;
  for (auto* t : {&exp_sums, &max_logits, &tmp_out}) {
    check_cuda(*t, "v2 scratch tensors");
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous(), "v2 scratch must be contiguous float32");
    TORCH_CHECK(t->size(0) == p.num_seqs && t->size(1) == p.num_heads && t->size(2) >= parts,
                "v2 scratch too small for max_context_len");
  }
  TORCH_CHECK(tmp_out.size(2) == exp_sums.size(2) && max_logits.size(2) == exp_sums.size(2),
              "v2 scratch tensors disagree on the partition count");
  p.exp_sums = exp_sums.data_ptr<float>();
  p.max_logits = max_logits.data_ptr<float>();
  p.tmp_out = tmp_out.data_ptr<float>();
  p.max_partitions = static_cast<int>(exp_sums.size(2));
  const DeviceScope scope(query.device());
  check_launch(launch_typed(p, query.scalar_type(), 2, as_stream(stream)), "paged_attention_v2");
}

// The fast decode kernel (kernels/fast/ops.py checks every argument first). Caches are
// [num_blocks, block_size, num_kv_heads, head_size] with any strides over the first three
// dimensions; part_* are the split scratch (empty when max_splits == 1).
void fast_decode(torch::Tensor out, torch::Tensor part_out, torch::Tensor part_max, torch::Tensor part_sum,
                 torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache, int64_t num_kv_heads,
                 double scale, double v_scale, torch::Tensor block_tables, torch::Tensor context_lens,
                 int64_t split_tokens, int64_t max_splits, bool prefetch, bool pdl, int64_t stages,
                 int64_t max_ctas_per_sm, bool warp_items,
                 std::optional<torch::Tensor> alibi_slopes, int64_t stream) {
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "out must have the query's dtype");
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes(),
              "caches must be [num_blocks, block_size, num_kv_heads, head_size]");
  TORCH_CHECK(key_cache.stride(3) == 1 && value_cache.stride(3) == 1, "cache head rows must be contiguous");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type(), "key and value caches differ in dtype");
  const int64_t block_size = key_cache.size(1);
  TORCH_CHECK(block_size >= 8 && block_size <= 256 && (block_size & (block_size - 1)) == 0,
              "block size must be a power of two from 8 to 256");
  blocksim::FastDecodeParams p{};
  fill_common(p, "every fast_decode tensor", out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
              context_lens, alibi_slopes);
  p.v_scale = static_cast<float>(v_scale);
  int log2 = 0;
  while ((int64_t{1} << log2) < block_size) ++log2;
  p.block_size_log2 = log2;
  p.split_tokens = static_cast<int>(split_tokens);
  p.max_splits = static_cast<int>(max_splits);
  p.prefetch = prefetch ? 1 : 0;
  if (pdl) {  // programmatic dependent launch exists from sm_90 on
    int major = 0;
    TORCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, query.get_device()) == cudaSuccess,
                "fast_decode: cannot read the device's compute capability");
    p.pdl = major >= 9 ? 1 : 0;
  }
  p.stages = static_cast<int>(stages);
  p.max_ctas_per_sm = static_cast<int>(max_ctas_per_sm);
  TORCH_CHECK(!warp_items || stages == 2, "fast_decode: warp items run on the 2-stage ring only, got ", stages,
              " stages");
  p.warp_items = warp_items ? 1 : 0;
  p.k_block_stride = key_cache.stride(0);
  p.k_token_stride = key_cache.stride(1);
  p.k_head_stride = key_cache.stride(2);
  p.v_block_stride = value_cache.stride(0);
  p.v_token_stride = value_cache.stride(1);
  p.v_head_stride = value_cache.stride(2);
  if (max_splits > 1) {
    for (auto* t : {&part_out, &part_max, &part_sum}) {
      check_cuda(*t, "split scratch tensors");
      TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous(), "split scratch must be contiguous float32");
      TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                  "split scratch must start on a 16-byte boundary (the reduce copies it with cp.async)");
      TORCH_CHECK(t->size(0) == p.num_seqs && t->size(1) == p.num_heads && t->size(2) == max_splits,
                  "split scratch must be [num_seqs, num_heads, max_splits(, head_size)]");
    }
    p.part_out = part_out.data_ptr<float>();
    p.part_max = part_max.data_ptr<float>();
    p.part_sum = part_sum.data_ptr<float>();
  }
  int q_dtype = 0;
  switch (query.scalar_type()) {
    case torch::kFloat16: q_dtype = blocksim::kFastF16; break;
    case torch::kBFloat16: q_dtype = blocksim::kFastBF16; break;
    default: TORCH_CHECK(false, "fast_decode: query must be float16 or bfloat16");
  }
  int kv_dtype = 0;
  switch (key_cache.scalar_type()) {
    case torch::kFloat16: kv_dtype = blocksim::kFastF16; break;
    case torch::kBFloat16: kv_dtype = blocksim::kFastBF16; break;
    case torch::kFloat8_e4m3fn: kv_dtype = blocksim::kFastFp8E4M3; break;
    default: TORCH_CHECK(false, "fast_decode: caches must be float16, bfloat16 or float8_e4m3fn");
  }
  TORCH_CHECK(stages == 0 || blocksim::fast_decode_smem_bytes(p.head_size, kv_dtype, p.stages) > 0,
              "fast_decode: ", stages, " shared-memory stages do not fit head size ", p.head_size);
  const DeviceScope scope(query.device());
  check_launch(blocksim::launch_fast_decode(p, q_dtype, kv_dtype, as_stream(stream)), "fast_decode");
}

// The paged prefill kernel (kernels/fast/prefill.py checks every argument first): caches as
// fast_decode's; query and out [total_new_tokens, num_heads, head_size]; config picks the tile
// configuration (0: the default).
void paged_prefill(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                   int64_t num_kv_heads, double scale, double v_scale, torch::Tensor block_tables,
                   torch::Tensor query_start_loc, torch::Tensor context_lens, int64_t max_query_len,
                   int64_t max_context_len, int64_t config, std::optional<torch::Tensor> alibi_slopes,
                   std::optional<torch::Tensor> key_new, std::optional<torch::Tensor> value_new, int64_t stream) {
  for (auto* t : {&out, &query, &key_cache, &value_cache, &block_tables, &query_start_loc, &context_lens}) {
    check_cuda(*t, "every paged_prefill tensor");
  }
  TORCH_CHECK(out.scalar_type() == query.scalar_type() && out.is_contiguous() && out.sizes() == query.sizes(),
              "out must be a contiguous tensor like query");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1 && query.stride(1) == query.size(2),
              "query must be [tokens, heads, head_size] with contiguous head rows");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(query.data_ptr()) % 16 == 0 &&
                  query.stride(0) % 8 == 0,
              "out and query must start 16-byte aligned, query tokens 8 elements apart "
              "(kernels.paged_prefill_attention copies such tensors)");
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes(),
              "caches must be [num_blocks, block_size, num_kv_heads, head_size]");
  TORCH_CHECK(key_cache.stride(3) == 1 && value_cache.stride(3) == 1, "cache head rows must be contiguous");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type(), "key and value caches differ in dtype");
  for (auto* t : {&block_tables, &query_start_loc, &context_lens}) {
    TORCH_CHECK(t->scalar_type() == torch::kInt32 && t->is_contiguous(), "index tensors must be contiguous int32");
  }
  const int64_t block_size = key_cache.size(1);
  TORCH_CHECK(block_size >= 8 && block_size <= 256 && (block_size & (block_size - 1)) == 0,
              "block size must be a power of two from 8 to 256");
  TORCH_CHECK(query_start_loc.size(0) == context_lens.size(0) + 1 && block_tables.size(0) == context_lens.size(0),
              "query_start_loc must have batch + 1 entries and block_tables batch rows");
  TORCH_CHECK(key_cache.size(2) == num_kv_heads && query.size(2) == key_cache.size(3), "cache geometry");
  blocksim::PagedPrefillParams p{};
  p.out = out.data_ptr();
  p.query = query.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.block_tables = block_tables.data_ptr<int>();
  p.query_start_loc = query_start_loc.data_ptr<int>();
  p.context_lens = context_lens.data_ptr<int>();
  if (alibi_slopes) {
    check_cuda(*alibi_slopes, "alibi_slopes");
    TORCH_CHECK(alibi_slopes->scalar_type() == torch::kFloat32 && alibi_slopes->is_contiguous() &&
                    alibi_slopes->numel() == query.size(1),
                "alibi_slopes must be contiguous float32 [num_heads]");
    p.alibi_slopes = alibi_slopes->data_ptr<float>();
  }
  p.scale = static_cast<float>(scale);
  p.v_scale = static_cast<float>(v_scale);
  p.num_seqs = static_cast<int>(context_lens.size(0));
  p.num_heads = static_cast<int>(query.size(1));
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.head_size = static_cast<int>(query.size(2));
  int log2 = 0;
  while ((int64_t{1} << log2) < block_size) ++log2;
  p.block_size_log2 = log2;
  p.max_blocks_per_seq = static_cast<int>(block_tables.size(1));
  p.num_blocks = static_cast<int>(key_cache.size(0));
  p.max_query_len = static_cast<int>(max_query_len);
  p.config = static_cast<int>(config);
  p.max_context_len = static_cast<int>(max_context_len);
  p.q_token_stride = query.stride(0);
  p.out_token_stride = out.stride(0);
  p.num_tokens = out.size(0);
  p.k_block_stride = key_cache.stride(0);
  p.k_token_stride = key_cache.stride(1);
  p.k_head_stride = key_cache.stride(2);
  p.v_block_stride = value_cache.stride(0);
  p.v_token_stride = value_cache.stride(1);
  p.v_head_stride = value_cache.stride(2);
  TORCH_CHECK(key_new.has_value() == value_new.has_value(), "paged_prefill: give both new keys and new values, or neither");
  if (key_new) {
    for (auto* t : {&*key_new, &*value_new}) {
      check_cuda(*t, "paged_prefill's new keys and values");
      TORCH_CHECK(t->scalar_type() == query.scalar_type() && t->dim() == 3 && t->size(0) == query.size(0) &&
                      t->size(1) == num_kv_heads && t->size(2) == query.size(2) && t->stride(2) == 1 &&
                      t->stride(1) == query.size(2) && t->stride(0) % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                  "paged_prefill: new keys and values must be 16-byte aligned [tokens, num_kv_heads, head_size] "
                  "tensors of the query's dtype with contiguous heads, tokens 8 elements apart");
    }
    p.key_new = key_new->data_ptr();
    p.value_new = value_new->data_ptr();
    p.kn_token_stride = key_new->stride(0);
    p.vn_token_stride = value_new->stride(0);
  }
  int q_dtype = 0;
  switch (query.scalar_type()) {
    case torch::kFloat16: q_dtype = blocksim::kFastF16; break;
    case torch::kBFloat16: q_dtype = blocksim::kFastBF16; break;
    default: TORCH_CHECK(false, "paged_prefill: query must be float16 or bfloat16");
  }
  int kv_dtype = 0;
  switch (key_cache.scalar_type()) {
    case torch::kFloat16: kv_dtype = blocksim::kFastF16; break;
    case torch::kBFloat16: kv_dtype = blocksim::kFastBF16; break;
    case torch::kFloat8_e4m3fn: kv_dtype = blocksim::kFastFp8E4M3; break;
    default: TORCH_CHECK(false, "paged_prefill: caches must be float16, bfloat16 or float8_e4m3fn");
  }
  const DeviceScope scope(query.device());
  check_launch(blocksim::launch_paged_prefill(p, q_dtype, kv_dtype, as_stream(stream)), "paged_prefill");
}

void reshape_and_cache(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache, torch::Tensor value_cache,
                       torch::Tensor slot_mapping, int64_t stream) {
  for (auto* t : {&key, &value, &key_cache, &value_cache, &slot_mapping}) check_cuda(*t, "reshape_and_cache tensors");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, "key/value head dimension must be contiguous");
  blocksim::ReshapeAndCacheParams p{};
  p.key = key.data_ptr();
  p.value = value.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.num_tokens = static_cast<int>(key.size(0));
  p.num_kv_heads = static_cast<int>(key.size(1));
  p.head_size = static_cast<int>(key.size(2));
  p.block_size = static_cast<int>(value_cache.size(3));
  p.num_slots = key_cache.size(0) * value_cache.size(3);
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  p.value_token_stride = value.stride(0);
  p.value_head_stride = value.stride(1);
  p.k_block_stride = key_cache.stride(0);
  p.v_block_stride = value_cache.stride(0);
  const DeviceScope scope(key.device());
  check_launch(blocksim::launch_reshape_and_cache(p, static_cast<int>(key.element_size()),
                                                  as_stream(stream)),
               "reshape_and_cache");
}

// Keys and values [tokens, kv_heads, head] into fast-layout caches [blocks, block_size, kv_heads, head]
// of the same dtype; every head row contiguous and 16-byte aligned (checked by the Python API).
void fast_cache_write(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache, torch::Tensor value_cache,
                      torch::Tensor slot_mapping, int64_t stream) {
  for (auto* t : {&key, &value, &key_cache, &value_cache, &slot_mapping}) check_cuda(*t, "fast_cache_write tensors");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  const int64_t es = key.element_size();
  TORCH_CHECK(value.element_size() == es && key_cache.element_size() == es && value_cache.element_size() == es,
              "fast_cache_write: key, value and caches must share one element size");
  const int64_t words = 16 / es;  // elements per 16-byte word
  auto w = [&](int64_t s) {
    TORCH_CHECK(s % words == 0, "fast_cache_write: strides must be multiples of 16 bytes");
    return s / words;
  };
  for (auto* t : {&key, &value, &key_cache, &value_cache}) {
    TORCH_CHECK(t->stride(t->dim() - 1) == 1 && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "fast_cache_write: head rows must be contiguous and 16-byte aligned");
  }
  TORCH_CHECK((key.size(2) * es) % 16 == 0, "fast_cache_write: a head row must be a multiple of 16 bytes");
  blocksim::FastCacheWriteParams p{};
  p.key = key.data_ptr();
  p.value = value.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.num_tokens = static_cast<int>(key.size(0));
  p.num_kv_heads = static_cast<int>(key.size(1));
  p.row_words = static_cast<int>(key.size(2) * es / 16);
  p.block_size = static_cast<int>(key_cache.size(1));
  p.num_slots = key_cache.size(0) * key_cache.size(1);
  p.key_token_stride = w(key.stride(0));
  p.key_head_stride = w(key.stride(1));
  p.value_token_stride = w(value.stride(0));
  p.value_head_stride = w(value.stride(1));
  p.kc_block_stride = w(key_cache.stride(0));
  p.kc_slot_stride = w(key_cache.stride(1));
  p.kc_head_stride = w(key_cache.stride(2));
  p.vc_block_stride = w(value_cache.stride(0));
  p.vc_slot_stride = w(value_cache.stride(1));
  p.vc_head_stride = w(value_cache.stride(2));
  const DeviceScope scope(key.device());
  check_launch(blocksim::launch_fast_cache_write(p, as_stream(stream)), "fast_cache_write");
}

// Device-visible address of a tensor's storage: itself on the GPU, its mapped address when it
// is pinned host memory (nullopt when the host memory is not mapped).
std::optional<int64_t> device_address(const torch::Tensor& t) {
  if (t.is_cuda()) return reinterpret_cast<int64_t>(t.data_ptr());
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, t.data_ptr(), 0) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later checks do not see it
    return std::nullopt;
  }
  return reinterpret_cast<int64_t>(dev);
}

void launch_pairs(const std::vector<int64_t>& srcs, const std::vector<int64_t>& dsts, const torch::Tensor& pairs_cpu,
                  int64_t block_bytes, int64_t stride_bytes, const torch::Device& device, cudaStream_t stream) {
  auto opts = torch::TensorOptions().dtype(torch::kInt64);
  auto ptrs = torch::empty({2, static_cast<int64_t>(srcs.size())}, opts);
  std::copy(srcs.begin(), srcs.end(), ptrs.data_ptr<int64_t>());
  std::copy(dsts.begin(), dsts.end(), ptrs.data_ptr<int64_t>() + srcs.size());
  auto ptrs_dev = ptrs.to(device);
  auto pairs_dev = pairs_cpu.to(device);
  check_launch(blocksim::launch_copy_block_pairs(ptrs_dev.data_ptr<int64_t>(),
                                                 ptrs_dev.data_ptr<int64_t>() + srcs.size(),
                                                 static_cast<int>(srcs.size()), pairs_dev.data_ptr<int64_t>(),
                                                 static_cast<int>(pairs_cpu.size(0)), block_bytes, stride_bytes,
                                                 stream),
               "block copy");
}

// block_mapping: CPU int64 [num_pairs, 2] of (src, dst) block ids, already validated.
void copy_blocks(std::vector<torch::Tensor> key_caches, std::vector<torch::Tensor> value_caches,
                 torch::Tensor block_mapping, int64_t stream) {
  TORCH_CHECK(key_caches.size() == value_caches.size() && !key_caches.empty(), "one key and value cache per layer");
  TORCH_CHECK(!block_mapping.is_cuda() && block_mapping.scalar_type() == torch::kInt64, "block_mapping: CPU int64");
  const auto& first = key_caches[0];
  std::vector<int64_t> ptrs;
  for (const auto& c : key_caches) ptrs.push_back(reinterpret_cast<int64_t>(c.data_ptr()));
  for (const auto& c : value_caches) ptrs.push_back(reinterpret_cast<int64_t>(c.data_ptr()));
  for (const auto& c : value_caches) {
    check_cuda(c, "caches");
    TORCH_CHECK(c.stride(0) == first.stride(0), "all caches must share the block stride");
  }
  for (const auto& c : key_caches) {
    check_cuda(c, "caches");
    TORCH_CHECK(c.stride(0) == first.stride(0), "all caches must share the block stride");
  }
  const int64_t block_bytes = (first.numel() / first.size(0)) * first.element_size();
  const DeviceScope scope(first.device());
  launch_pairs(ptrs, ptrs, block_mapping.contiguous(), block_bytes, first.stride(0) * first.element_size(),
               first.device(), as_stream(stream));
}

// Swaps between GPU and pinned CPU memory (either direction) or between two GPU tensors of one
// device: one kernel for all pairs when both sides are device-addressable, otherwise (host
// memory not mapped) one asynchronous copy per block.
void swap_blocks(torch::Tensor src, torch::Tensor dst, torch::Tensor block_mapping, int64_t stream) {
  TORCH_CHECK(src.is_cuda() || dst.is_cuda(), "swap_blocks needs a CUDA side");
  TORCH_CHECK(!block_mapping.is_cuda() && block_mapping.scalar_type() == torch::kInt64, "block_mapping: CPU int64");
  const auto device = src.is_cuda() ? src.device() : dst.device();
  const DeviceScope scope(device);
  const cudaStream_t st = as_stream(stream);
  const int64_t block_bytes = (src.numel() / src.size(0)) * src.element_size();
  const int64_t src_stride = src.stride(0) * src.element_size();
  const int64_t dst_stride = dst.stride(0) * dst.element_size();
  auto pairs = block_mapping.contiguous();
  const auto s = device_address(src);
  const auto d = device_address(dst);
  if (s && d && src_stride == dst_stride && block_bytes % 16 == 0 && src_stride % 16 == 0) {
    launch_pairs({*s}, {*d}, pairs, block_bytes, src_stride, device, st);
    return;
  }
  const cudaMemcpyKind kind = src.is_cuda() && dst.is_cuda() ? cudaMemcpyDeviceToDevice
                              : src.is_cuda()                ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyHostToDevice;
  const char* sp = static_cast<const char*>(src.data_ptr());
  char* dp = static_cast<char*>(dst.data_ptr());
  const int64_t* pr = pairs.data_ptr<int64_t>();
  for (int64_t i = 0; i < pairs.size(0); ++i) {
    check_launch(cudaMemcpyAsync(dp + pr[2 * i + 1] * dst_stride, sp + pr[2 * i] * src_stride, block_bytes, kind, st),
                 "swap_blocks copy");
  }
}

// Which path swap_blocks takes for these tensors ("kernel" or "memcpy"); for tests and reports.
std::string swap_path(torch::Tensor src, torch::Tensor dst) {
  return device_address(src) && device_address(dst) ? "kernel" : "memcpy";
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "blocksim paged-attention and cache kernels (CUDA)";
  m.def("paged_attention_v1", &paged_attention_v1);
  m.def("paged_attention_v2", &paged_attention_v2);
  m.def("fast_decode", &fast_decode);
  m.def("fast_decode_smem_bytes", [](int64_t head_size, bool fp8, int64_t stages) {
    return static_cast<int64_t>(blocksim::fast_decode_smem_bytes(
        static_cast<int>(head_size), fp8 ? blocksim::kFastFp8E4M3 : blocksim::kFastF16, static_cast<int>(stages)));
  });
  m.def("fast_decode_ctas_per_sm", [](int64_t head_size, const std::string& dtype, int64_t stages, bool prefetch,
                                      int64_t max_ctas_per_sm) {
    blocksim::FastDecodeParams p{};
    int ctas = 0;
    p.ctas_per_sm = &ctas;
    p.num_seqs = p.num_heads = p.num_kv_heads = p.max_splits = 1;
    p.head_size = static_cast<int>(head_size);
    p.block_size_log2 = 4;
    p.split_tokens = blocksim::kFastTile;
    p.stages = static_cast<int>(stages);
    p.prefetch = prefetch ? 1 : 0;
    p.max_ctas_per_sm = static_cast<int>(max_ctas_per_sm);
    const int q = dtype == "bfloat16" ? blocksim::kFastBF16 : blocksim::kFastF16;
    const int kv = dtype == "bfloat16" ? blocksim::kFastBF16 : dtype == "fp8" ? blocksim::kFastFp8E4M3 : blocksim::kFastF16;
    check_launch(blocksim::launch_fast_decode(p, q, kv, nullptr), "fast_decode_ctas_per_sm");
    return static_cast<int64_t>(ctas);
  });
  m.def("paged_prefill", &paged_prefill);
  m.def("paged_prefill_block_rows", &blocksim::paged_prefill_block_rows);
  m.def("reshape_and_cache", &reshape_and_cache);
  m.def("fast_cache_write", &fast_cache_write);
  m.def("copy_blocks", &copy_blocks);
  m.def("swap_blocks", &swap_blocks);
  m.def("swap_path", &swap_path);
  m.def("v1_smem_bytes", &blocksim::paged_attention_v1_smem_bytes);
}
