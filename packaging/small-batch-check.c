// The engine's contract, checked on a llama.cpp build: a matmul over k token columns gives each column
// the result of a 1-column matmul, bit for bit (see packaging/llama-cpp-patches/).
//
//   small-batch-check [--types q4_K,q6_K,...] [--shapes N] [--threads 1,2] [--seed S] [--vec-dot] [--gemv]
//                     [--quiet]
//   small-batch-check --bench ROWSxLEN [--types ...] [--threads N]
//
// For each weight type, N random (rows, row length) shapes; for each shape and thread count, the k-column
// products for k = 1..32 and a few larger k are compared with the columns computed one at a time. The
// weights are placed as llama.cpp places a model's: in the CPU's repack buffer where this build repacks
// the type (Q4_0, IQ4_NL; Q4_K on CPUs without the AVX-512 tile), in plain memory otherwise.
// With --vec-dot, each 1-column result is also compared with the type's own ggml vec_dot (what a 1-token
// matmul computes without the patch). With --gemv, for weights repacked 8 rows at a time (Q4_0, IQ4_NL on x86),
// each 1-column result is compared with llama.cpp's own gemv for that layout (what a 1-token matmul of them
// computes without the patch). Prints one line per type and exits 1 if any column differs.
//
// With --bench, nothing is compared: for each type, one matrix of ROWS rows of LEN values (a model's matrix, say
// 8192x3072) times k = 1, 2, 3, 4, 6, 8, 12 and 16 columns, each the best of 9 runs, printed as the CPU time of
// a run (clock(): on one thread, the kernel's cost whatever else the machine runs; on Windows, wall time), the
// cost beside one column's, and int8 GOP/s per core (2 * ROWS * LEN * k operations over that CPU time).
//
// Built and run by tests/packaging/test_small_batch_kernels.py against the installed llama-cpp-python's libraries,
// and by packaging/windows-check.sh as a Windows program (MinGW-w64, run under Wine).

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <psapi.h>
#ifdef _MSC_VER
#pragma comment(lib, "psapi.lib")
#define strcasecmp _stricmp
#endif
#else
#include <dlfcn.h>
#endif

static const int BATCH_SIZES[] = {
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
    29, 30, 31, 32, 48, 63, 64, 96, 128, 232,
};
#define N_BATCH_SIZES ((int) (sizeof(BATCH_SIZES) / sizeof(BATCH_SIZES[0])))
#define MAX_COLS 232

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {  // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static float rng_uniform(void) {
    return (float) ((rng_next() >> 40) * (1.0 / 16777216.0));
}

static float rng_normal(void) {
    const float u = rng_uniform() + 1e-7f, v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

// Values as a model's: mostly normal, with outlier channels, runs of zeros and +/- ties at the block maximum.
static void fill_values(float * x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; ++i) {
        x[i] = scale * rng_normal();
    }
    for (int64_t i = 0; i < n / 64; ++i) {
        const int64_t j = (int64_t) (rng_next() % (uint64_t) n);
        switch (rng_next() % 4) {
            case 0: x[j] *= 20.0f; break;
            case 1: x[j] = 0.0f; break;
            case 2: x[j] = 4.0f * scale; if (j + 1 < n) { x[j + 1] = -4.0f * scale; } break;
            default: break;
        }
    }
}

// the CPU's repack buffer type where this build repacks W's type, else NULL (llama.cpp's choice for model weights)
static ggml_backend_buffer_type_t repack_buft_for(struct ggml_tensor * mul_mat) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (get_extra == NULL) {
        return NULL;
    }
    for (ggml_backend_buffer_type_t * buft = get_extra(dev); buft && *buft; ++buft) {
        // as llama.cpp asks: would this op run with its weights in that buffer type?
        ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(*buft, 0);
        struct ggml_tensor * w = mul_mat->src[0];
        w->buffer = probe;
        const bool ok = ggml_backend_dev_supports_op(dev, mul_mat);
        w->buffer = NULL;
        ggml_backend_buffer_free(probe);
        if (ok) {
            return *buft;
        }
    }
    return NULL;
}

struct weights {
    struct ggml_context * ctx;
    ggml_backend_buffer_t buffer;
    struct ggml_tensor  * w;
    const char          * placed;     // buffer type name
    void                * quantized;  // the rows as quantized, before any repacking
};

static struct weights make_weights(enum ggml_type type, int64_t n_rows, int64_t row_len) {
    struct weights out = {0};
    struct ggml_init_params ip = { ggml_tensor_overhead() * 4 + (1 << 16), NULL, true };
    out.ctx = ggml_init(ip);
    out.w = ggml_new_tensor_2d(out.ctx, type, row_len, n_rows);
    struct ggml_tensor * x = ggml_new_tensor_2d(out.ctx, GGML_TYPE_F32, row_len, 4);
    struct ggml_tensor * op = ggml_mul_mat(out.ctx, out.w, x);
    ggml_backend_buffer_type_t buft = repack_buft_for(op);
    if (buft == NULL) {
        buft = ggml_backend_cpu_buffer_type();
    }
    out.placed = ggml_backend_buft_name(buft);
    // only W is allocated here; x and op stay unallocated placeholders
    struct ggml_context * wctx = ggml_init((struct ggml_init_params) { ggml_tensor_overhead(), NULL, true });
    struct ggml_tensor * w = ggml_dup_tensor(wctx, out.w);
    out.buffer = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    out.w = w;
    ggml_free(out.ctx);
    out.ctx = wctx;

    float * values = malloc(sizeof(float) * n_rows * row_len);
    fill_values(values, n_rows * row_len, 0.05f);
    void * quantized = malloc(ggml_row_size(type, row_len) * n_rows);
    ggml_quantize_chunk(type, values, quantized, 0, n_rows, row_len, NULL);
    ggml_backend_tensor_set(w, quantized, 0, ggml_nbytes(w));
    out.quantized = quantized;
    free(values);
    return out;
}

// y (n_rows x n_cols) = W x the first n_cols columns of act
static void matmul(struct weights * W, const float * act, int n_cols, int n_threads, float * y) {
    const int64_t row_len = W->w->ne[0], n_rows = W->w->ne[1];
    const size_t mem = ggml_tensor_overhead() * 4 + ggml_graph_overhead() + sizeof(float) * (size_t) (row_len + n_rows) * n_cols + 4096;
    struct ggml_context * ctx = ggml_init((struct ggml_init_params) { mem, NULL, false });
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, row_len, n_cols);
    memcpy(x->data, act, sizeof(float) * row_len * n_cols);
    struct ggml_tensor * out = ggml_mul_mat(ctx, W->w, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    struct ggml_cplan plan = ggml_graph_plan(gf, n_threads, NULL);
    plan.work_data = plan.work_size ? malloc(plan.work_size) : NULL;
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(2);
    }
    free(plan.work_data);
    memcpy(y, out->data, sizeof(float) * n_rows * n_cols);
    ggml_free(ctx);
}

struct type_result {
    long long compared, differ;
    int shapes, first_bad_k, repacked;
    long long vs_vec_dot_compared, vs_vec_dot_differ;  // 1-column results against ggml's vec_dot
    long long vs_gemv_compared, vs_gemv_differ;        // 1-column results of repacked weights against the gemv
};

typedef void (*gemv_t)(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);

// A function of that name in any library this process has loaded, or NULL. A Windows DLL exposes only what it
// exports: llama.cpp's gemv is found there only in a ggml-cpu DLL linked to export every symbol.
static gemv_t find_gemv(const char * name) {
#ifdef _WIN32
    HMODULE modules[512];
    DWORD needed = 0;
    if (!EnumProcessModules(GetCurrentProcess(), modules, sizeof(modules), &needed)) {
        return NULL;
    }
    for (DWORD i = 0; i < needed / sizeof(HMODULE) && i < 512; ++i) {
        const FARPROC found = GetProcAddress(modules[i], name);
        if (found != NULL) {
            return (gemv_t) (void (*)(void)) found;
        }
    }
    return NULL;
#else
    return (gemv_t) dlsym(RTLD_DEFAULT, name);
#endif
}

// llama.cpp's 1-row gemv for weights of this type repacked 8 rows at a time (x86), or NULL
static gemv_t repacked_gemv(enum ggml_type type) {
    const char * name = type == GGML_TYPE_Q4_0   ? "ggml_gemv_q4_0_8x8_q8_0"
                      : type == GGML_TYPE_IQ4_NL ? "ggml_gemv_iq4_nl_8x8_q8_0" : NULL;
    return name ? find_gemv(name) : NULL;
}

// y[c * n_rows + r] = the gemv of the repacked weights and activation column c, quantized to Q8_0
static void gemv_reference(const struct weights * W, gemv_t gemv, const float * act, int n_cols, float * y) {
    const int64_t row_len = W->w->ne[0], n_rows = W->w->ne[1];
    char * qa = malloc(ggml_row_size(GGML_TYPE_Q8_0, row_len));
    for (int c = 0; c < n_cols; ++c) {
        ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float(act + (size_t) c * row_len, qa, row_len);
        gemv((int) row_len, &y[(size_t) c * n_rows], (size_t) n_rows, W->w->data, qa, 1, (int) n_rows);
    }
    free(qa);
}

// y[c * n_rows + r] = the type's vec_dot of weight row r and activation column c, as llama.cpp computes a
// 1-token matmul without the patch: the activation quantized to the vec_dot type, then one call per pair
static void vec_dot_reference(const struct weights * W, const float * act, int n_cols, float * y) {
    const enum ggml_type type = W->w->type;
    const int64_t row_len = W->w->ne[0], n_rows = W->w->ne[1];
    const struct ggml_type_traits_cpu * traits = ggml_get_type_traits_cpu(type);
    const struct ggml_type_traits_cpu * act_traits = ggml_get_type_traits_cpu(traits->vec_dot_type);
    const size_t w_row = ggml_row_size(type, row_len), a_row = ggml_row_size(traits->vec_dot_type, row_len);
    char * qa = malloc(a_row);
    for (int c = 0; c < n_cols; ++c) {
        act_traits->from_float(act + (size_t) c * row_len, qa, row_len);
        for (int64_t r = 0; r < n_rows; ++r) {
            traits->vec_dot((int) row_len, &y[(size_t) c * n_rows + r], 0, (const char *) W->quantized + r * w_row, 0, qa, 0, 1);
        }
    }
    free(qa);
}

// Adds n to *compared and the count of a[i] that differ from b[i], bit for bit, to *differ.
static void count_differ(const float * a, const float * b, int64_t n, long long * compared, long long * differ) {
    for (int64_t i = 0; i < n; ++i) {
        *differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    }
    *compared += n;
}

static void check_shape(enum ggml_type type, int64_t n_rows, int64_t row_len, const int * threads, int n_threads_opts,
                        bool vs_vec_dot, bool vs_gemv, struct type_result * res) {
    struct weights W = make_weights(type, n_rows, row_len);
    const bool repacked = strcmp(W.placed, ggml_backend_buft_name(ggml_backend_cpu_buffer_type())) != 0;
    res->repacked += repacked;
    const gemv_t gemv = vs_gemv && repacked ? repacked_gemv(type) : NULL;
    float * act = malloc(sizeof(float) * row_len * MAX_COLS);
    fill_values(act, row_len * MAX_COLS, 1.0f);
    float * single = malloc(sizeof(float) * n_rows * MAX_COLS);
    float * batch  = malloc(sizeof(float) * n_rows * MAX_COLS);

    for (int t = 0; t < n_threads_opts; ++t) {
        for (int c = 0; c < MAX_COLS; ++c) {
            matmul(&W, act + (size_t) c * row_len, 1, threads[t], single + (size_t) c * n_rows);
        }
        const int n_ref = 8;  // 1-column results compared with a reference
        if (vs_vec_dot && t == 0) {
            vec_dot_reference(&W, act, n_ref, batch);
            count_differ(batch, single, n_rows * n_ref, &res->vs_vec_dot_compared, &res->vs_vec_dot_differ);
        }
        if (gemv && t == 0) {
            gemv_reference(&W, gemv, act, n_ref, batch);
            count_differ(batch, single, n_rows * n_ref, &res->vs_gemv_compared, &res->vs_gemv_differ);
        }
        for (int b = 0; b < N_BATCH_SIZES; ++b) {
            const int k = BATCH_SIZES[b];
            matmul(&W, act, k, threads[t], batch);
            for (int64_t i = 0; i < n_rows * k; ++i) {
                res->compared++;
                if (memcmp(&batch[i], &single[i], sizeof(float)) != 0) {
                    res->differ++;
                    if (res->first_bad_k == 0 || k < res->first_bad_k) {
                        res->first_bad_k = k;
                    }
                }
            }
        }
    }
    res->shapes++;
    free(batch);
    free(single);
    free(act);
    free(W.quantized);
    ggml_backend_buffer_free(W.buffer);
    ggml_free(W.ctx);
}

static const int BENCH_SIZES[] = {1, 2, 3, 4, 6, 8, 12, 16};

static void bench_type(enum ggml_type type, int64_t n_rows, int64_t row_len, int n_threads) {
    struct weights W = make_weights(type, n_rows, row_len);
    float * act = malloc(sizeof(float) * row_len * 16);
    float * out = malloc(sizeof(float) * n_rows * 16);
    fill_values(act, row_len * 16, 1.0f);
    printf("%-6s %lldx%lld (%s), %d thread(s):", ggml_type_name(type), (long long) n_rows, (long long) row_len,
           W.placed, n_threads);
    double one = 0.0;
    for (size_t b = 0; b < sizeof(BENCH_SIZES) / sizeof(BENCH_SIZES[0]); ++b) {
        const int k = BENCH_SIZES[b];
        matmul(&W, act, k, n_threads, out);  // warm-up
        double best = 1e30;
        for (int run = 0; run < 9; ++run) {
            const clock_t t0 = clock();
            matmul(&W, act, k, n_threads, out);
            const double t = (double) (clock() - t0) / CLOCKS_PER_SEC;
            best = t < best ? t : best;
        }
        const double ms = best * 1e3;
        one = k == 1 ? ms : one;
        printf("  k=%d %.2f ms %.2fx %.0f GOP/s", k, ms, ms / one, 2.0 * n_rows * row_len * k / (best * 1e9));
    }
    printf("\n");
    free(out);
    free(act);
    free(W.quantized);
    ggml_backend_buffer_free(W.buffer);
    ggml_free(W.ctx);
}

static void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static bool parse_type(const char * name, enum ggml_type * out) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * tn = ggml_type_name((enum ggml_type) t);
        if (tn && strcasecmp(tn, name) == 0) {
            *out = (enum ggml_type) t;
            return true;
        }
    }
    return false;
}

int main(int argc, char ** argv) {
    const char * types_arg = "q4_K,q6_K,q4_1";
    int n_shapes = 12;
    int threads[4] = {1, 2};
    int n_threads_opts = 2;
    bool quiet = false;
    bool vs_vec_dot = false;
    bool vs_gemv = false;
    long long bench_rows = 0, bench_len = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--types") == 0 && i + 1 < argc) {
            types_arg = argv[++i];
        } else if (strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
            n_shapes = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            rng_state ^= strtoull(argv[++i], NULL, 10) * 0xD1B54A32D192ED03ull;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            n_threads_opts = sscanf(argv[++i], "%d,%d,%d,%d", &threads[0], &threads[1], &threads[2], &threads[3]);
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = true;
        } else if (strcmp(argv[i], "--vec-dot") == 0) {
            vs_vec_dot = true;
        } else if (strcmp(argv[i], "--gemv") == 0) {
            vs_gemv = true;
        } else if (strcmp(argv[i], "--bench") == 0 && i + 1 < argc) {
            if (sscanf(argv[++i], "%lldx%lld", &bench_rows, &bench_len) != 2 || bench_rows < 1 || bench_len < 1) {
                fprintf(stderr, "--bench takes ROWSxLEN, e.g. 8192x3072\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--types q4_K,q6_K,...] [--shapes N] [--threads 1,2] [--seed S] [--vec-dot] [--gemv] [--quiet] | --bench ROWSxLEN [--types ...] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    ggml_log_set(quiet_log, NULL);
    ggml_backend_load_all();
    ggml_cpu_init();

    int failed = 0;
    char types[256];
    snprintf(types, sizeof(types), "%s", types_arg);
    for (char * name = strtok(types, ","); name; name = strtok(NULL, ",")) {
        enum ggml_type type;
        if (!parse_type(name, &type)) {
            fprintf(stderr, "unknown type %s\n", name);
            return 2;
        }
        if (bench_rows) {
            bench_type(type, bench_rows, bench_len - bench_len % ggml_blck_size(type), threads[0]);
            continue;
        }
        const int64_t block = ggml_blck_size(type);
        struct type_result res = {0};
        for (int s = 0; s < n_shapes; ++s) {
            // row lengths of up to 4096 values (as a model's hidden size), row counts 1..160 (odd ones included)
            const int64_t row_len = block * (1 + (int64_t) (rng_next() % (uint64_t) (4096 / block)));
            const int64_t n_rows  = s % 3 == 0 ? 8 * (1 + (int64_t) (rng_next() % 20)) : 1 + (int64_t) (rng_next() % 160);
            check_shape(type, n_rows, row_len, threads, n_threads_opts, vs_vec_dot, vs_gemv, &res);
        }
        printf("%-6s %3d shapes (%3d repacked), k up to %d, %d thread setting(s): %lld outputs, %lld differ",
               ggml_type_name(type), res.shapes, res.repacked, MAX_COLS, n_threads_opts, res.compared, res.differ);
        if (res.differ) {
            printf(" (first at k = %d)", res.first_bad_k);
            failed = 1;
        }
        if (vs_vec_dot) {
            printf("; 1 token against vec_dot: %lld outputs, %lld differ", res.vs_vec_dot_compared, res.vs_vec_dot_differ);
            failed |= res.vs_vec_dot_differ != 0;
        }
        if (vs_gemv) {
            printf("; 1 token against llama.cpp's gemv: %lld outputs, %lld differ", res.vs_gemv_compared, res.vs_gemv_differ);
            failed |= res.vs_gemv_differ != 0 || res.vs_gemv_compared == 0;
        }
        printf("\n");
        if (!quiet) {
            fflush(stdout);
        }
    }
    return failed;
}
