/*
 * spm.cc: SentencePiece models (Llama 2's tokenizer.model) trained, encoded
 * and decoded in process through Debian's libsentencepiece, behind the C API
 * of fsdp.h (fl_spm_*). The library is C++ and has no C interface, so this one
 * file is compiled as C++ (mk/cdef.mk); no exception crosses into C: the
 * library reports through util::Status, and allocations that throw are
 * caught here and turned into the core's error values.
 *
 * An fl_spm is used by one thread at a time (its output buffers are its
 * own): give each worker thread its own.
 */
#include "fsdp.h"
#include "error.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" int fl_fail(fl_status status, const char *fmt, ...);
extern "C" int fl_fail_prefix(const char *fmt, ...);

/* The largest model file read: SentencePiece models are a few MiB. */
static const size_t MAX_SPM_MODEL = 256u << 20;

struct fl_spm {
    sentencepiece::SentencePieceProcessor proc;
    std::string path;
    std::vector<int> ids;   /* encode's result (as the library gives it) */
    std::vector<int32_t> out;
    std::string text;       /* decode's result */
};

extern "C" fl_spm *fl_spm_load(const char *path) {
    fl_spm *t = new (std::nothrow) fl_spm;
    if (!t) {
        fl_fail(FL_ERR_OOM, "sentencepiece %s: out of memory", path);
        return nullptr;
    }
    try {
        t->path = path;
        /* Read by the core's input reader, not the library's own open: a
         * FIFO or a device is refused instead of waited on or read without
         * end ([Note: inputs are regular files] in core/io/input_file.c). */
        size_t len;
        char *bytes = fl_file_read_all(path, MAX_SPM_MODEL, "a SentencePiece model", &len);
        if (!bytes) {
            fl_fail_prefix("sentencepiece");
            delete t;
            return nullptr;
        }
        std::string serialized;
        try {
            serialized.assign(bytes, len);
        } catch (...) {
            fl_file_buffer_free(bytes);
            throw;
        }
        fl_file_buffer_free(bytes);
        auto st = t->proc.LoadFromSerializedProto(serialized);
        if (!st.ok()) {
            fl_fail(FL_ERR_IO, "sentencepiece %s: not a SentencePiece model (%s)", path, st.ToString().c_str());
            delete t;
            return nullptr;
        }
    } catch (const std::exception &e) {
        fl_fail(FL_ERR_IO, "sentencepiece %s: %s", path, e.what());
        delete t;
        return nullptr;
    }
    return t;
}

extern "C" void fl_spm_free(fl_spm *t) { delete t; }

extern "C" int64_t fl_spm_vocab_size(const fl_spm *t) { return t->proc.GetPieceSize(); }
extern "C" int64_t fl_spm_bos_id(const fl_spm *t) { return t->proc.bos_id(); }
extern "C" int64_t fl_spm_eos_id(const fl_spm *t) { return t->proc.eos_id(); }
extern "C" int64_t fl_spm_unk_id(const fl_spm *t) { return t->proc.unk_id(); }
extern "C" int64_t fl_spm_pad_id(const fl_spm *t) { return t->proc.pad_id(); }

extern "C" int64_t fl_spm_piece_to_id(const fl_spm *t, const char *piece, size_t len) {
    int id = t->proc.PieceToId(absl::string_view(piece, len));
    /* PieceToId answers unk for an unknown piece: tell the two apart. */
    if (id == t->proc.unk_id() && t->proc.IdToPiece(id) != std::string(piece, len)) return -1;
    return id;
}

extern "C" const char *fl_spm_id_to_piece(const fl_spm *t, int64_t id, size_t *len) {
    if (id < 0 || id >= t->proc.GetPieceSize()) {
        fl_fail(FL_ERR_ARG, "sentencepiece %s: id %lld is not in the vocabulary (%d pieces)", t->path.c_str(),
                (long long)id, t->proc.GetPieceSize());
        return nullptr;
    }
    const std::string &p = t->proc.IdToPiece((int)id);
    *len = p.size();
    return p.c_str();
}

extern "C" bool fl_spm_is_control(const fl_spm *t, int64_t id) {
    return id >= 0 && id < t->proc.GetPieceSize() && t->proc.IsControl((int)id);
}

extern "C" int64_t fl_spm_encode(fl_spm *t, const char *text, size_t len, const int32_t **ids) {
    try {
        auto st = t->proc.Encode(absl::string_view(text, len), &t->ids);
        if (!st.ok()) {
            fl_fail(FL_ERR_ARG, "sentencepiece %s: encode failed: %s", t->path.c_str(), st.ToString().c_str());
            return -1;
        }
        t->out.assign(t->ids.begin(), t->ids.end());
    } catch (const std::bad_alloc &) {
        fl_fail(FL_ERR_OOM, "sentencepiece %s: out of memory encoding %zu bytes", t->path.c_str(), len);
        return -1;
    }
    *ids = t->out.data();
    return (int64_t)t->out.size();
}

extern "C" int64_t fl_spm_decode(fl_spm *t, const int32_t *ids, int64_t n, const char **text) {
    int size = t->proc.GetPieceSize();
    for (int64_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= size) {
            fl_fail(FL_ERR_ARG, "sentencepiece %s: decode: id %d at position %lld is not in the vocabulary (%d pieces)",
                    t->path.c_str(), (int)ids[k], (long long)k, size);
            return -1;
        }
    }
    try {
        t->ids.assign(ids, ids + n);
        auto st = t->proc.Decode(t->ids, &t->text);
        if (!st.ok()) {
            fl_fail(FL_ERR_ARG, "sentencepiece %s: decode failed: %s", t->path.c_str(), st.ToString().c_str());
            return -1;
        }
    } catch (const std::bad_alloc &) {
        fl_fail(FL_ERR_OOM, "sentencepiece %s: out of memory decoding %lld ids", t->path.c_str(), (long long)n);
        return -1;
    }
    *text = t->text.c_str();
    return (int64_t)t->text.size();
}

extern "C" int fl_spm_train(int n, const char *const *keys, const char *const *values) {
    try {
        std::unordered_map<std::string, std::string> kwargs;
        for (int i = 0; i < n; i++) {
            /* spm_train's --random_seed is no trainer field: the library's
             * global generator takes it. */
            if (std::strcmp(keys[i], "random_seed") == 0) {
                sentencepiece::SetRandomGeneratorSeed((unsigned)std::strtoul(values[i], nullptr, 10));
                continue;
            }
            kwargs[keys[i]] = values[i];
        }
        auto st = sentencepiece::SentencePieceTrainer::Train(kwargs);
        if (!st.ok()) {
            auto input = kwargs.find("input");
            return fl_fail(FL_ERR_ARG, "sentencepiece: training on %s failed: %s",
                           input == kwargs.end() ? "(no input)" : input->second.c_str(), st.ToString().c_str());
        }
    } catch (const std::bad_alloc &) {
        return fl_fail(FL_ERR_OOM, "sentencepiece: out of memory while training");
    }
    return FL_OK;
}
