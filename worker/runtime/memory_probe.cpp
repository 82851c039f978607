// llamaq's memory probe: llama.cpp's per-buffer-type memory breakdown of a context (a C++ call
// of libllama, llama-ext.h) as a C function that ctypes can reach.
#include <cstddef>
#include <cstdint>
#include <map>

struct llama_context;
struct llama_model;
typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;
typedef struct ggml_backend_device * ggml_backend_dev_t;

struct llama_memory_breakdown_data {
    size_t model   = 0;
    size_t context = 0;
    size_t compute = 0;
};
using llama_memory_breakdown = std::map<ggml_backend_buffer_type_t, llama_memory_breakdown_data>;

llama_memory_breakdown llama_get_memory_breakdown(const struct llama_context * ctx);
int32_t llama_model_n_devices(const struct llama_model * model);
ggml_backend_dev_t llama_model_get_device(const struct llama_model * model, int i);

extern "C" {
bool ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft);
ggml_backend_dev_t ggml_backend_buft_get_device(ggml_backend_buffer_type_t buft);

struct llamaq_memory {
    ggml_backend_dev_t device;  // NULL: host memory
    size_t model;
    size_t context;
    size_t compute;
};

// Writes up to `cap` entries (one per buffer type); returns how many there are.
int llamaq_memory_breakdown(const struct llama_context * ctx, struct llamaq_memory * out, int cap) {
    int n = 0;
    for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
        if (n < cap) {
            out[n].device  = ggml_backend_buft_is_host(buft) ? nullptr : ggml_backend_buft_get_device(buft);
            out[n].model   = mb.model;
            out[n].context = mb.context;
            out[n].compute = mb.compute;
        }
        n++;
    }
    return n;
}

int llamaq_model_n_devices(const struct llama_model * model) {
    return llama_model_n_devices(model);
}

ggml_backend_dev_t llamaq_model_device(const struct llama_model * model, int i) {
    return llama_model_get_device(model, i);
}
}
