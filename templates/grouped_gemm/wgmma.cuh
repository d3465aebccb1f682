// The wgmma kernel (sm_90a), persistent and warp-specialised: a grid of at most one block per SM, each taking the tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... of the raster, so the producer loads a block's next tile while its consumers
// store the last. Warpgroup 0 is the producer: warp 1 finds the block's tiles (the walk of offs) up to kScheduleSlots
// ahead, and one thread of warp 0 issues the TMA loads of a stage, A's kTileM x 64 box and B's kBRows rows as boxes of
// 128 (the column tile's halves, or SwiGLU's gate and up tiles), into kStages stages, each with a full mbarrier (TMA's
// bytes landed) and an empty one (every consumer warp is done reading). Each consumer warpgroup owns 64 rows: per stage
// four wgmma m64 x kBRows x k16 from shared memory into its fp32 accumulators, the products of one stage in flight
// while the next stage's are issued (FP8: four k32 products per 128-wide K block into the block's own accumulators,
// waited for, then scaled and added to the result's). SwiGLU's gate and up tiles lie one after the other in shared
// memory, so one wgmma computes both: a thread's column blocks j and j + kTileN / 8 are the gate and the up product of
// the same output columns. K past num_k and rows past the tensors load as zeros (TMA's out-of-bounds fill), so only N
// needs checks.
// Needs kernel.cu.j2's variant constants and schedule.
{% include "common/swizzle.cuh" %}
{% include "common/mma.cuh" %}
{% include "common/tma.cuh" %}
{% with wgmma_widths = ([tile_n if epilogue == "none" else 2 * tile_n] + ([contract.sizes.scale_block] if dtype == "e4m3" else [])) | unique | list, wgmma_input = {"bf16": "bf16", "fp16": "f16", "e4m3": "e4m3"}[dtype] %}
{% include "common/wgmma.cuh" %}
{% endwith %}
{% include "common/warp_roles.cuh" %}

namespace {

constexpr int kConsumerGroups = kTileM / 64;  // a warpgroup per 64 rows
constexpr int kConsumerWarps = kConsumerGroups * 4;
constexpr int kThreads = (kConsumerGroups + 1) * kgen::kWarpgroupThreads;
constexpr int kBoxRows = 128;                      // rows of one TMA box (the host's maps)
constexpr int kRowBytes = kTileK * static_cast<int>(sizeof(TIn));
constexpr int kABytes = kTileM * kRowBytes, kBBytes = kBRows * kRowBytes, kStageBytes = kABytes + kBBytes;
constexpr int kBarrierBytes = 16 * kStages;       // a full and an empty mbarrier per stage
// The tiles found ahead of the loads: the walk of offs takes several thousand cycles at hundreds of experts, which
// in the loading warp delayed each tile's first stage past the consumers' epilogue (ncu, bench/NOTES.md,
// thirty-first session).
constexpr int kScheduleSlots = 2;
// The epilogue stages each warp's 16 result rows in shared memory, kPassColumns columns at a time, and stores them
// 16 bytes a lane, whole rows at a time; rows padded by 16 bytes, so the 8 rows of a warp's accumulator stores start
// on distinct banks. Passes of a part of the columns leave shared memory for a fourth stage of the 128 x 256 tiles.
constexpr int kPassColumns = {{ contract.sizes.pass_columns }};
static_assert(kTileN % kPassColumns == 0 && kPassColumns % 16 == 0, "the epilogue's passes differ from the tile");
constexpr int kOutRowBytes = kPassColumns * static_cast<int>(sizeof(T)) + 16, kFp8RowBytes = kPassColumns + 16;
constexpr int kStagingBytes = kTileM * (kOutRowBytes + (kQuantize ? kFp8RowBytes : 0));
constexpr int kDynamicSmemBytes = kgen::kSwizzleAlignment + kStages * kStageBytes + kBarrierBytes + kStagingBytes;
// The producer only issues copies; the consumers hold kBRows / 2 accumulators each.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;

static_assert(kTileM == 64 || kTileM == 128, "grouped_gemm: with mma=wgmma, tile_m must be 64 or 128 (a consumer warpgroup per 64 rows)");
static_assert({{ num_warps }} == kConsumerWarps, "grouped_gemm: with mma=wgmma, num_warps counts the consumer warps and must be tile_m / 16");
static_assert(kRowBytes == 128, "grouped_gemm: with mma=wgmma, tile_k must make rows of one 128-byte swizzle span (64 16-bit "
                                "or 128 FP8 values)");
static_assert(kBRows % kBoxRows == 0 && kBRows <= 256,
              "grouped_gemm: with mma=wgmma, B's rows per tile (tile_n, twice that for SwiGLU) must be 128 or 256");
static_assert({{ min_blocks_per_sm }} == 1, "grouped_gemm: with mma=wgmma, min_blocks_per_sm must be 1 (setmaxnreg needs one block per SM)");
static_assert(kgen::kWarpgroupThreads * (kProducerRegisters + kConsumerGroups * kConsumerRegisters) <= 65536,
              "the register budgets exceed the register file");
static_assert(kThreads == {{ contract.threads }}, "threads per block differ from the host's contract");
static_assert(kDynamicSmemBytes == {{ contract.dynamic_smem_bytes }}, "shared memory differs from the host's contract");
static_assert(kBoxRows == {{ contract.sizes.box_rows }}, "TMA boxes differ from the host's maps");
static_assert(kCluster == 1 || (kCluster == 2 && kBRows == 2 * kBoxRows),
              "grouped_gemm: with mma=wgmma, cluster must be 1, or 2 with B tiles of two 128-row boxes (one from each "
              "block): tile_n 256, or SwiGLU's 128");

struct Barriers {
    unsigned base;
    __device__ unsigned full(int stage) const { return base + 8 * stage; }
    __device__ unsigned empty(int stage) const { return base + 8 * (kStages + stage); }
};

// A cluster's unit `unit`: row tiles 2p and 2p + 1 of one column tile (the raster of block_tile over pairs of row
// tiles); block `rank` of the cluster takes row tile 2p + rank. A block whose row tile is past the last expert's,
// beside one that is not, computes its peer's rows and stores none (its group ends where it starts), so both blocks
// fill and release the same stages. Where both then compute one expert's rows, they share its B tile. In every lane
// of the calling (whole) warp.
struct ClusterTile {
    BlockTile tile;
    bool shares_b;
};

// The schedule's slots: a tile found (expert -1: the block's work ends) and a full and an empty mbarrier each.
struct Schedule {
    ClusterTile tiles[kScheduleSlots];
    alignas(8) unsigned long long full[kScheduleSlots], empty[kScheduleSlots];
};

__device__ __forceinline__ ClusterTile cluster_tile(long long unit, unsigned rank, const int* offs, long long num_experts,
                                                    long long num_rows, long long masked_rows, long long row_tiles,
                                                    long long column_tiles) {
    long long pair, column_tile;
    raster(unit, (row_tiles + 1) / 2, column_tiles, pair, column_tile);
    const TileOwner first = tile_owner(offs, num_experts, num_rows, masked_rows, 2 * pair);
    const TileOwner second = 2 * pair + 1 < row_tiles ? tile_owner(offs, num_experts, num_rows, masked_rows, 2 * pair + 1)
                                                      : TileOwner{-1, 0, 0};
    const TileOwner peer = rank == 0 ? second : first;
    TileOwner own = rank == 0 ? first : second;
    if (own.expert < 0 && peer.expert >= 0) own = {peer.expert, peer.first_row, peer.first_row};
    // Both blocks' view of it: the experts they compute (a block past the end computes its peer's).
    const int first_expert = first.expert >= 0 ? first.expert : second.expert;
    const int second_expert = second.expert >= 0 ? second.expert : first.expert;
    return {BlockTile{own, column_tile}, first_expert >= 0 && first_expert == second_expert};
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
grouped_gemm({{ contract.signature("grouped_gemm") }}) {
    extern __shared__ unsigned char smem_bytes[];
    const unsigned smem = kgen::align_up<kgen::kSwizzleAlignment>(kgen::smem_addr(smem_bytes));
    const Barriers barriers{smem + kStages * kStageBytes};
    // The tile whose first K step a stage holds, written by the producer before the stage's loads: the consumers
    // read it once the stage's full barrier completes (its arrival releases the write, their wait acquires it).
    __shared__ BlockTile stage_tiles[kStages];
    __shared__ Schedule schedule;
    // In a cluster every consumer warp of both blocks releases each stage (the peer's copies of a shared B tile
    // land in it), and a block leaves only with its peer, which may arrive on its barriers until then.
    if (threadIdx.x == 0) {
        for (int stage = 0; stage < kStages; ++stage) {
            kgen::mbarrier_init(barriers.full(stage), 1);
            kgen::mbarrier_init(barriers.empty(stage), kConsumerWarps * kCluster);
        }
        for (int slot = 0; slot < kScheduleSlots; ++slot) {
            kgen::mbarrier_init(kgen::smem_addr(&schedule.full[slot]), 1);
            kgen::mbarrier_init(kgen::smem_addr(&schedule.empty[slot]), 1);
        }
        kgen::mbarrier_init_fence();
    }
    if constexpr (kCluster > 1) kgen::cluster_sync();  // the peer's barriers are initialised before any arrival
    else __syncthreads();
    const auto leave = [] {
        if constexpr (kCluster > 1) kgen::cluster_sync();
    };
    const int k_tiles = static_cast<int>((num_k + kTileK - 1) / kTileK);  // at least 1: the host takes K = 0 elsewhere
    // A block's work: its tiles, or in a cluster its cluster's units (pairs of row tiles).
    const long long num_units = kCluster > 1 ? (row_tiles + 1) / 2 * column_tiles : row_tiles * column_tiles;
    const int warp = kgen::warp_index(), lane = threadIdx.x % 32;

    if (warp < 4) {
        kgen::release_registers<kProducerRegisters>();
        [[maybe_unused]] const unsigned rank = kCluster > 1 ? kgen::cluster_rank() : 0u;
        if (warp == 1) {
            // ---- Scheduler: the block's tiles (unit blockIdx.x / kCluster, then every (gridDim.x / kCluster)-th,
            // skipping row tiles past the last expert's) into the schedule's slots, then one with no tile.
            int found = 0;
            for (long long unit = blockIdx.x / kCluster;; unit += gridDim.x / kCluster) {
                const bool done = unit >= num_units;
                ClusterTile next = {BlockTile{TileOwner{-1, 0, 0}, 0}, false};
                if (!done) {
                    if constexpr (kCluster > 1) next = cluster_tile(unit, rank, offs, num_experts, num_rows, masked_rows, row_tiles, column_tiles);
                    else next.tile = block_tile(unit, offs, num_experts, num_rows, masked_rows, row_tiles, column_tiles);
                    if (next.tile.owner.expert < 0) continue;
                }
                const int slot = found % kScheduleSlots;
                // A fresh barrier's previous phase counts as complete, so the first round does not wait.
                kgen::mbarrier_wait(kgen::smem_addr(&schedule.empty[slot]), ((found / kScheduleSlots) & 1) ^ 1);
                if (lane == 0) {
                    schedule.tiles[slot] = next;
                    kgen::mbarrier_arrive(kgen::smem_addr(&schedule.full[slot]));  // releases the write
                }
                ++found;
                if (done) break;
            }
        }
        if (warp != 0) {
            leave();
            return;
        }
        // ---- Loads: the scheduled tiles' K steps from lane 0, and after the last a stage with no tile ends the
        // consumers' work.
        int step = 0;  // K steps issued, over all of the block's tiles
        for (int taken = 0;; ++taken) {
            const int slot = taken % kScheduleSlots;
            kgen::mbarrier_wait(kgen::smem_addr(&schedule.full[slot]), (taken / kScheduleSlots) & 1);
            // Lane 0 alone reads the slot (it alone issues the copies) and releases it; the others learn only
            // whether the work is done. (Every lane reading it, then __syncwarp and lane 0's release, is ordered
            // too, but racecheck reported each reuse of a slot as a hazard.)
            ClusterTile scheduled{};
            if (lane == 0) {
                scheduled = schedule.tiles[slot];
                kgen::mbarrier_arrive(kgen::smem_addr(&schedule.empty[slot]));
            }
            const BlockTile tile = scheduled.tile;
            [[maybe_unused]] const bool shares_b = scheduled.shares_b;
            const bool done = __shfl_sync(0xffffffffu, tile.owner.expert < 0, 0) != 0;
            if (lane == 0) {
                // TMA coordinates are 32-bit: the host keeps a's and b's rows below 2^31.
                const int a_row = static_cast<int>(tile.owner.first_row);
                // This expert's rows of b: num_n, or (SwiGLU) num_n gate rows then num_n up rows.
                const long long b_first = static_cast<long long>(tile.owner.expert) * (kBRows / kTileN) * num_n +
                                          tile.column_tile * kTileN;
                for (int kt = 0; kt < (done ? 1 : k_tiles); ++kt) {
                    const int stage = (step + kt) % kStages;
                    // A fresh barrier's previous phase counts as complete, so the first round does not wait.
                    kgen::mbarrier_wait(barriers.empty(stage), (((step + kt) / kStages) & 1) ^ 1);
                    if (kt == 0) stage_tiles[stage] = tile;
                    if (done) {
                        kgen::mbarrier_arrive(barriers.full(stage));  // no bytes: the consumers read the end
                        break;
                    }
                    const unsigned stage_a = smem + stage * kStageBytes, stage_b = stage_a + kABytes;
                    kgen::mbarrier_arrive_expect_tx(barriers.full(stage), kStageBytes);
                    kgen::tma_load_3d(stage_a, &map_a, kt * kTileK, 0, a_row, barriers.full(stage));
#pragma unroll
                    for (int box = 0; box < kBRows / kBoxRows; ++box) {
                        const long long b_row = b_first + (kSwiglu ? box * num_n : box * kBoxRows);
                        const unsigned box_smem = stage_b + box * kBoxRows * kRowBytes;
                        if constexpr (kCluster > 1) {
                            if (shares_b) {  // box `rank` from this block, into both blocks' stage
                                if (box == static_cast<int>(rank)) {
                                    kgen::tma_load_3d_multicast(box_smem, &map_b, kt * kTileK, 0, static_cast<int>(b_row),
                                                                barriers.full(stage), (1u << kCluster) - 1);
                                }
                                continue;
                            }
                        }
                        kgen::tma_load_3d(box_smem, &map_b, kt * kTileK, 0, static_cast<int>(b_row), barriers.full(stage));
                    }
                }
            }
            if (done) {
                leave();
                return;
            }
            step += k_tiles;
            __syncwarp();
        }
    }

    // ---- Consumers: the tiles in the producer's order, until a stage holds none. ----
    kgen::claim_registers<kConsumerRegisters>();
    // A stage read: released to this block's producer, and in a cluster to the peer's too.
    [[maybe_unused]] const unsigned peer = kCluster > 1 ? kgen::cluster_rank() ^ 1u : 0u;
    const auto release = [&](int stage) {
        kgen::mbarrier_arrive(barriers.empty(stage));
        if constexpr (kCluster > 1) kgen::mbarrier_arrive_remote(barriers.empty(stage), peer);
    };
    const int consumer_thread = threadIdx.x - kgen::kWarpgroupThreads;
    const int group = consumer_thread / kgen::kWarpgroupThreads;
    const int warp_row0 = 64 * group + 16 * ((consumer_thread / 32) % 4);  // this warp's 16 rows of the tile
    const int thread_row = warp_row0 + lane / 4;
    unsigned char* const out_rows = smem_bytes + (smem - kgen::smem_addr(smem_bytes)) + kStages * kStageBytes + kBarrierBytes;
    [[maybe_unused]] unsigned char* const fp8_rows = out_rows + kTileM * kOutRowBytes;
    float acc[kBRows / 8][4];  // set by each tile's first product (FP8: zeroed at its start), or zeros below for K = 0
    for (int step = 0;; ) {
        const int first_stage = step % kStages;
        kgen::mbarrier_wait(barriers.full(first_stage), (step / kStages) & 1);
        const BlockTile tile = stage_tiles[first_stage];
        if (tile.owner.expert < 0) {
            leave();
            return;
        }
        // FP8: the scales of the thread's two rows (row-major or MN-major; none past the tensor, whose rows load as
        // zeros) and of the tile's 128-column blocks (none past N: an incomplete tile's last block, whose products
        // are never stored; N is whole scale blocks, so a tile of one block is never past it), a K block's at a
        // time, each loaded a K block ahead: an L2 round trip outlasts a block's products. The result starts at
        // zero, so every block's scaled product is one fused multiply-add.
        const long long scale_row = tile.owner.first_row + thread_row;
        const bool low_row_scaled = scale_row < num_rows, high_row_scaled = scale_row + 8 < num_rows;
        const float* low_row_scales = a_scale + scale_row * a_scale_row_stride;
        const float* high_row_scales = low_row_scales + 8 * a_scale_row_stride;
        const float* column_scales = b_scale + (tile.owner.expert * (num_n / kScaleBlock) + tile.column_tile * kColumnBlocks) * (num_k / kScaleBlock);
        [[maybe_unused]] float next_a_low = 0.f, next_a_high = 0.f, next_b_blocks[kColumnBlocks];
        [[maybe_unused]] const auto load_scales = [&]() {
            next_a_low = low_row_scaled ? *low_row_scales : 0.f, next_a_high = high_row_scaled ? *high_row_scales : 0.f;
#pragma unroll
            for (int column_block = 0; column_block < kColumnBlocks; ++column_block) {
                const bool in_n = !kHasIncompleteTile || kColumnBlocks == 1 ||
                                  tile.column_tile * kColumnBlocks + column_block < num_n / kScaleBlock;
                next_b_blocks[column_block] = in_n ? column_scales[column_block * (num_k / kScaleBlock)] : 0.f;
            }
            low_row_scales += a_scale_block_stride, high_row_scales += a_scale_block_stride, ++column_scales;
        };
        if constexpr (kFp8) {
#pragma unroll
            for (int j = 0; j < kBRows / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
            if (k_tiles > 0) load_scales();
        }
        for (int kt = 0; kt < k_tiles; ++kt, ++step) {
            const int stage = step % kStages;
            const unsigned stage_a = smem + stage * kStageBytes + group * 64 * kRowBytes, stage_b = smem + stage * kStageBytes + kABytes;
            // A k step moves 32 bytes inside the swizzled rows: 2 in a descriptor's start field (address / 16),
            // which cannot carry out of it (shared memory ends below 2^18 bytes).
            const unsigned long long a_descriptor = kgen::k_major_descriptor(stage_a), b_descriptor = kgen::k_major_descriptor(stage_b);
            kgen::mbarrier_wait(barriers.full(stage), (step / kStages) & 1);
            if constexpr (kFp8) {
                // Two-level accumulation: this K block's product alone, then scaled by a's and b's scales and added
                // to the fp32 result outside the tensor core, whose FP8 accumulation is narrower than fp32. A tile
                // of two column blocks takes them one after the other: one block's part accumulators (64 registers)
                // beside the result's, where both blocks' would not fit.
                const float a_low = next_a_low, a_high = next_a_high;
                float b_blocks[kColumnBlocks];
#pragma unroll
                for (int column_block = 0; column_block < kColumnBlocks; ++column_block) b_blocks[column_block] = next_b_blocks[column_block];
                if (kt + 1 < k_tiles) load_scales();
                // Every column block's products take this warpgroup's 64 x 128 block of A: a tile of several loads it
                // into registers once (ldmatrix from TMA's swizzled rows; matrix i of a k32 step is rows 8 (i % 2) and
                // K bytes 16 (i / 2) on), where each block's shared-memory products would read it again.
                [[maybe_unused]] unsigned a_fragments[kTileK / kgen::kWgmmaK][4];
                if constexpr (kColumnBlocks > 1) {
                    const int matrix = lane / 8, row = 16 * (warp % 4) + 8 * (matrix % 2) + lane % 8;
#pragma unroll
                    for (int kk = 0; kk < kTileK / kgen::kWgmmaK; ++kk) {
                        kgen::ldmatrix_x4(a_fragments[kk], stage_a + row * kRowBytes + ((2 * kk + matrix / 2) ^ (row % 8)) * 16);
                    }
                }
#pragma unroll
                for (int column_block = 0; column_block < kColumnBlocks; ++column_block) {
                    float part[kScaleBlock / 8][4];
                    kgen::fence_operands(acc);  // the last block's additions stay before these products' issue
                    kgen::wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < kTileK / kgen::kWgmmaK; ++kk) {  // a k32 step moves 32 bytes too
                        const unsigned long long b_block = b_descriptor + column_block * (kScaleBlock * kRowBytes / 16) + 2 * kk;
                        if constexpr (kColumnBlocks > 1) kgen::wgmma_rs<kScaleBlock, 0>(part, a_fragments[kk], b_block, kk > 0);
                        else kgen::wgmma_ss<kScaleBlock, 0>(part, a_descriptor + 2 * kk, b_block, kk > 0);
                    }
                    kgen::wgmma_commit();
                    kgen::wgmma_wait<0>();
                    kgen::fence_operands(part);
                    if (column_block == kColumnBlocks - 1 && lane == 0) release(stage);
                    const float scale[2] = {a_low * b_blocks[column_block], a_high * b_blocks[column_block]};
#pragma unroll
                    for (int j = 0; j < kScaleBlock / 8; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc[column_block * kScaleBlock / 8 + j][e] = fmaf(part[j][e], scale[e / 2], acc[column_block * kScaleBlock / 8 + j][e]);
                }
                continue;
            }
            kgen::fence_operands(acc);
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kTileK / kgen::kWgmmaK; ++kk) {
                kgen::wgmma_ss<kBRows, 0>(acc, a_descriptor + 2 * kk, b_descriptor + 2 * kk, kt > 0 || kk > 0);
            }
            kgen::wgmma_commit();
            kgen::fence_operands(acc);
            kgen::wgmma_wait<1>();  // the previous stage's products are done: release it
            kgen::fence_operands(acc);
            if (kt > 0 && lane == 0) release((step - 1) % kStages);
        }
        if constexpr (!kFp8) {  // (the FP8 loop released every stage itself)
            kgen::wgmma_wait<0>();
            kgen::fence_operands(acc);
            if (lane == 0) release((step - 1) % kStages);  // the producer loads on meanwhile
        }
        // The host takes K = 0 to the mma_sync kernel (a TMA map needs K > 0), yet this branch stays: without it
        // ptxas (NVRTC 13.0) serialises the fp16 kernel's wgmma (C7514), which kgen build refuses.
        if (k_tiles == 0) {
#pragma unroll
            for (int j = 0; j < kBRows / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
        }
        const long long n0 = tile.column_tile * kTileN;

        // The results, rounded to T, in the first kTileN / 8 column blocks: the product, or silu(gate) up.
        constexpr int kOutBlocks = kTileN / 8;
#pragma unroll
        for (int j = 0; j < kOutBlocks; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = kSwiglu ? rounded_swiglu(acc[j][e], acc[j + kOutBlocks][e]) : rounded(acc[j][e]);
        // Quantizing: each row's scale from its amax over the block's 128 columns (this thread's, then its row's four
        // lanes'), before the passes.
        [[maybe_unused]] float inverse[2] = {0.f, 0.f};
        if constexpr (kQuantize) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const long long row = tile.owner.first_row + thread_row + 8 * half;
                float amax = 0.f;
#pragma unroll
                for (int j = 0; j < kOutBlocks; ++j) {
                    amax = kgen::max_keeping_nan(amax, fabsf(acc[j][2 * half]));
                    amax = kgen::max_keeping_nan(amax, fabsf(acc[j][2 * half + 1]));
                }
                amax = kgen::max_keeping_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = kgen::max_keeping_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const float scale = kgen::e4m3_scale(amax);
                inverse[half] = 1.f / scale;
{% if epilogue == "swiglu_quantize" %}{# the signature has scales and out_fp8 with this epilogue alone #}
                if (lane % 4 == 0 && row < tile.owner.group_end) scales[(n0 / kTileN) * scales_stride + row] = scale;
{% endif %}
            }
        }
        // Pass by pass: the pass's columns into the warp's staging rows (every row: the copy skips those past the
        // group), then the rows inside the group, 16-byte pieces inside N (N is a multiple of 8; of 128 when
        // quantizing), to out.
        constexpr int kPassBlocks = kPassColumns / 8, kOutChunks = kPassColumns * static_cast<int>(sizeof(T)) / 16;
#pragma unroll
        for (int pass = 0; pass < kTileN / kPassColumns; ++pass) {
            const long long pass_n0 = n0 + pass * kPassColumns;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
#pragma unroll
                for (int b = 0; b < kPassBlocks; ++b) {
                    const int j = pass * kPassBlocks + b, row = thread_row + 8 * half;
                    const int offset = row * kOutRowBytes + (8 * b + 2 * (lane % 4)) * static_cast<int>(sizeof(T));
                    *reinterpret_cast<unsigned*>(out_rows + offset) = kgen::pack2<T>(acc[j][2 * half], acc[j][2 * half + 1]);
                    if constexpr (kQuantize) {
                        *reinterpret_cast<unsigned short*>(fp8_rows + row * kFp8RowBytes + 8 * b + 2 * (lane % 4)) =
                            kgen::to_e4m3x2(acc[j][2 * half] * inverse[half], acc[j][2 * half + 1] * inverse[half]);
                    }
                }
            }
            __syncwarp();
            for (int i = lane; i < 16 * kOutChunks; i += 32) {
                const int tile_row = warp_row0 + i / kOutChunks, chunk = i % kOutChunks;
                const long long row = tile.owner.first_row + tile_row, column = pass_n0 + chunk * (16 / static_cast<int>(sizeof(T)));
                if (row >= tile.owner.group_end || (kHasIncompleteTile && column >= num_n)) continue;
                *reinterpret_cast<uint4*>(out + row * num_n + column) = *reinterpret_cast<const uint4*>(out_rows + tile_row * kOutRowBytes + 16 * chunk);
            }
{% if epilogue == "swiglu_quantize" %}
            for (int i = lane; i < 16 * (kPassColumns / 16); i += 32) {
                const int tile_row = warp_row0 + i / (kPassColumns / 16), chunk = i % (kPassColumns / 16);
                const long long row = tile.owner.first_row + tile_row;
                if (row >= tile.owner.group_end) continue;
                *reinterpret_cast<uint4*>(out_fp8 + row * num_n + pass_n0 + 16 * chunk) = *reinterpret_cast<const uint4*>(fp8_rows + tile_row * kFp8RowBytes + 16 * chunk);
            }
{% endif %}
            __syncwarp();  // the rows are read before the next pass's (or tile's) results overwrite them
        }
    }
}
