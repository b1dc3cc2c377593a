/* compressed.c: the third form of a saved tensor, beside held and recipe
 * (docs/ARCHITECTURE.md, "Saved tensors: held, recipe or compressed").
 *
 * Under compress:B (fr_compress_enter) an op that saves an activation through
 * fr_node_save_activation keeps B-bit codes per group of FR_COMPRESS_GROUP
 * elements (kernels.def: compress_pack) instead of the tensor, and one that
 * needs only the sign of its output (ReLU, leaky ReLU) keeps one bit per
 * element (fr_node_save_sign). Both are recipes whose make() decodes, so the
 * engine unpacks them like any recipe, just before the backward that reads
 * them, and frees the decoded tensor after it. The codes live in a u8
 * tensor allocated under FR_TAG_SAVED, so the ledger's `saved` is their
 * exact size; the original activation is not held and dies with its last
 * forward reference.
 *
 * The rounding's random stream is keyed by one seed per packed tensor, drawn
 * from compression's own generator (fr_compress_next_seed), and the element
 * index, so no code depends on the thread count. Not from the random-op
 * generator dropout draws from (fr_random_next_seed): each packed tensor
 * would move it, and the dropout masks after it would differ from plain's
 * (another forward and loss), and from those of a checkpoint's replay,
 * which packs where its no-grad forward did not (a gradient of another
 * function than the one whose loss was reported; docs/ARCHITECTURE.md,
 * "Saved tensors: held, recipe or compressed").
 *
 * The codes are over the tensor's dense storage as it lies: a channels-last
 * activation (a model's channels-last mode, nn/model.h) is packed in its
 * NHWC byte order and decoded into a channels-last tensor again, so a group
 * holds FR_COMPRESS_GROUP consecutive elements of storage in either layout
 * (the same tensor's codes differ between the layouts; each is the
 * format's, kernels.def). */
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "node.h"

typedef struct {
    fr_recipe base;
    fr_tensor *packed;  /* u8 codes (FR_TAG_SAVED) */
    int bits;           /* 8, 4, 2; 1: a sign mask */
    bool channels_last; /* the storage order packed: decoded into the same */
    fr_device device;
    int ndim;
    int64_t shape[FR_MAX_DIMS];
} packed_recipe;

static _Thread_local int compress_bits;

fr_status fr_compress_enter(int bits, int *previous) {
    if (bits != 0 && bits != 8 && bits != 4 && bits != 2)
        return fr_error(FR_ERR_ARG, "compress: bits must be 8, 4 or 2 (0: off), got %d", bits);
    *previous = compress_bits;
    compress_bits = bits;
    return FR_OK;
}

void fr_compress_restore(int previous) { compress_bits = previous; }

int fr_compress_bits(void) { return compress_bits; }

static fr_tensor *packed_make(fr_recipe *self) {
    packed_recipe *r = (packed_recipe *)self;
    fr_tensor *y = r->channels_last
                       ? fr_empty_channels_last(r->device, r->shape, FR_TAG_TRANSIENT)
                       : fr_empty(r->device, FR_F32, r->ndim, r->shape, FR_TAG_TRANSIENT);
    if (!y)
        return NULL;
    fr_status st = r->bits == 1 ? fr_sign_unpack_out(y, r->packed)
                                : fr_compress_unpack_out(y, r->packed, r->bits);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}

/* r as codes of a contiguous tensor of >= 2 dimensions, else NULL */
static const packed_recipe *codes_of(const fr_recipe *r) {
    const packed_recipe *p = r && r->make == packed_make ? (const packed_recipe *)r : NULL;
    return p && p->bits > 1 && !p->channels_last && p->ndim >= 2 ? p : NULL;
}

int64_t fr_compressed_dim1(const fr_recipe *r, fr_device *dev) {
    const packed_recipe *p = codes_of(r);
    *dev = p ? p->device : FR_CPU;
    return p ? p->shape[1] : 0;
}

fr_status fr_compressed_decode_into(const fr_recipe *r, fr_tensor *dst) {
    const packed_recipe *p = codes_of(r);
    if (!p)
        return fr_error(FR_ERR_ARG, "compress: decode into a tensor: not codes of a contiguous tensor");
    int64_t n = 1;
    for (int i = 0; i < p->ndim; i++)
        n *= p->shape[i];
    if (dst->dtype != FR_F32 || !fr_is_contiguous(dst) || fr_numel(dst) != n ||
        fr_device_of(dst) != p->device)
        return fr_error(FR_ERR_ARG, "compress: decode into a tensor of another size, type or device");
    return fr_compress_unpack_out(dst, p->packed, p->bits);
}

static void packed_destroy(fr_recipe *self) {
    packed_recipe *r = (packed_recipe *)self;
    fr_release(r->packed);
    free(r);
}

/* Whether t is an activation compression applies to: one the forward made
 * (its storage's home is `transient`: parameters and input batches are
 * counted as what they are and held), dense (contiguous or channels last:
 * the codes follow the storage). A half activation is
 * refused rather than held at full width, so compress:B never quietly keeps
 * more than it says. */
static fr_status eligible(const fr_tensor *t, bool *yes) {
    *yes = compress_bits && t->storage->home_tag == FR_TAG_TRANSIENT &&
           (fr_is_contiguous(t) || fr_is_channels_last(t)) && fr_numel(t) > 0;
    if (*yes && t->dtype != FR_F32)
        return fr_error(FR_ERR_DTYPE,
                        "compress:%d: an activation of dtype %s was to be saved compressed; "
                        "compression takes f32 activations only (run in f32, or without compress)",
                        compress_bits, fr_dtype_name(t->dtype));
    return FR_OK;
}

static _Thread_local size_t sign_bytes_packed;
size_t fr_sign_bytes_packed(void) { return sign_bytes_packed; }

static fr_recipe *pack(fr_tensor *t, int bits) {
    size_t n = (size_t)fr_numel(t);
    int64_t bytes = (int64_t)(bits == 1 ? fr_sign_nbytes(n) : fr_compress_nbytes(bits, n));
    packed_recipe *r = calloc(1, sizeof *r);
    if (!r) {
        fr_error(FR_ERR_OOM, "compress: out of memory");
        return NULL;
    }
    r->base = (fr_recipe){.refcount = 1, .op = bits == 1 ? "sign mask" : "compress",
                          .make = packed_make, .destroy = packed_destroy};
    r->bits = bits;
    r->channels_last = fr_is_channels_last(t);
    r->device = fr_device_of(t);
    r->ndim = t->ndim;
    memcpy(r->shape, t->shape, sizeof r->shape);
    r->packed = fr_empty(r->device, FR_U8, 1, &bytes, FR_TAG_SAVED);
    fr_status st = !r->packed          ? fr_last_status()
                   : bits == 1         ? fr_sign_pack_out(r->packed, t)
                                       : fr_compress_pack_out(r->packed, t, bits,
                                                              fr_compress_next_seed());
    if (st != FR_OK) {
        packed_destroy(&r->base);
        return NULL;
    }
    if (bits == 1)
        sign_bytes_packed += (size_t)bytes;
    return &r->base;
}

fr_status fr_compressed_of(fr_tensor *t, fr_recipe **out) {
    *out = NULL;
    bool yes;
    FR_TRY(eligible(t, &yes));
    if (!yes)
        return FR_OK;
    const packed_recipe *cached = (const packed_recipe *)t->packed;
    if (!cached || t->packed_version != t->storage->version || cached->bits != compress_bits) {
        fr_recipe *r = pack(t, compress_bits);
        if (!r)
            return fr_last_status();
        fr_recipe_release(t->packed);
        t->packed = r;
        t->packed_version = t->storage->version;
    }
    *out = fr_recipe_retain(t->packed);
    return FR_OK;
}

int fr_node_save_activation(fr_node *node, fr_tensor *t, bool use_recipe) {
    FR_ASSERT(t);
    fr_recipe *live = use_recipe ? fr_live_recipe(t) : NULL;
    if (live)
        return fr_node_save_recipe(node, fr_recipe_retain(live));
    fr_recipe *r;
    if (fr_compressed_of(t, &r) != FR_OK)
        return -1;
    return r ? fr_node_save_recipe(node, r) : fr_node_save_held(node, t);
}

bool fr_compress_would_pack(const fr_tensor *t) {
    bool yes;
    return t->dtype == FR_F32 && eligible(t, &yes) == FR_OK && yes;
}

fr_status fr_sign_mask_of(fr_tensor *t, fr_recipe **out) {
    *out = NULL;
    bool yes;
    FR_TRY(eligible(t, &yes));
    if (yes && !(*out = pack(t, 1)))
        return fr_last_status();
    return FR_OK;
}

int fr_node_save_sign(fr_node *node, fr_tensor *t) {
    FR_ASSERT(t);
    if (fr_live_recipe(t))
        return fr_node_save(node, t);
    bool yes;
    if (eligible(t, &yes) != FR_OK)
        return -1;
    if (!yes)
        return fr_node_save_held(node, t);
    fr_recipe *r = pack(t, 1);
    return r ? fr_node_save_recipe(node, r) : -1;
}

/* The bits themselves, for a backward that reads the mask as bits
 * (fr_sign_act_backward) instead of unpacking an f32 tensor of 1 and 0: at a
 * block output that tensor is as large as the activation (40 MiB of f32 at
 * ResNet-56's batch 640 for 1.25 MiB of bits; bench/RESULTS.md, issue 23).
 * Only for a dy whose storage lies in the order the mask was packed in
 * (both contiguous, or both channels last): bit k is storage element k. */
fr_tensor *fr_node_sign_bits(fr_node *node, int i, const fr_tensor *dy) {
    FR_ASSERT(i >= 0 && i < node->n_saved);
    const fr_recipe *r = node->saved[i].recipe;
    if (!r || r->make != packed_make)
        return NULL;
    const packed_recipe *p = (const packed_recipe *)r;
    bool same_order = p->channels_last ? fr_is_channels_last(dy) : fr_is_contiguous(dy);
    return p->bits == 1 && same_order ? fr_retain(p->packed) : NULL;
}
