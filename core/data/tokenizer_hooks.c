/*
 * tokenizer_hooks.c: the core's tokenizers (core/text) as streaming-loader
 * hooks ([Note: the tokenizer hook] in fsdp.h), so a raw corpus streams
 * through a tokenizer.json BPE or a SentencePiece model in the workers.
 *
 * BPE: the hook's arg is a loaded fl_bpe; each worker gets a clone (a new
 * handle on the same model: the vocabulary and merges are loaded once).
 * SentencePiece has no clone: arg is the model's path and each worker loads
 * its own (a few MB for Llama 2's).
 */
#include "data.h"

static void *bpe_open(void *arg) { return fl_bpe_clone((const fl_bpe *)arg); }

static int64_t bpe_encode(void *self, const char *text, size_t len, const int32_t **ids)
{
    return fl_bpe_encode(self, text, len, false, ids);
}

static void bpe_close(void *self) { fl_bpe_free(self); }

fl_tokenizer_hook fl_bpe_hook(const fl_bpe *t)
{
    fl_tokenizer_hook h = { bpe_open, bpe_encode, bpe_close, (void *)t };
    return h;
}

static void *spm_open(void *arg) { return fl_spm_load((const char *)arg); }

static int64_t spm_encode(void *self, const char *text, size_t len, const int32_t **ids)
{
    return fl_spm_encode(self, text, len, ids);
}

static void spm_close(void *self) { fl_spm_free(self); }

fl_tokenizer_hook fl_spm_hook(const char *path)
{
    fl_tokenizer_hook h = { spm_open, spm_encode, spm_close, (void *)path };
    return h;
}
