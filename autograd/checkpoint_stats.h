/* checkpoint_stats.h: the batch statistics a checkpointed segment's forward
 * computed, handed to its replay in backward (autograd/fn_checkpoint.c).
 *
 * A replay runs the segment again on the same input bytes, so each batch
 * norm in it would compute the statistics its first forward computed, bit
 * for bit (the same kernel on the same values). The checkpoint node keeps
 * each one's (mean, invstd), C floats each, in the order the forward made
 * them; the replay takes them back instead of summing every activation
 * again. Not taken (computed again, as before) when the segment's input was
 * kept as compressed codes (the replay's input is their decoding, not the
 * forward's bytes), for a norm the segment runs more than once, and after
 * an entry was lost to a failed allocation. Internal: the fused BN +
 * activation (fn_bn_act.c) calls these. */
#ifndef FR_CHECKPOINT_STATS_H
#define FR_CHECKPOINT_STATS_H

#include "../tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* During a replay: when the replayed forward kept statistics for the batch
 * norm with this gamma over an x of this channel count and size (the next
 * such entry in the forward's order), copies them into mean and invstd (f32, contiguous, C
 * each, on the host) and returns true; otherwise leaves both and returns
 * false, and the caller computes them. Outside a replay, false. */
bool fr_checkpoint_stats_take(const fr_tensor *gamma, const fr_tensor *x, fr_tensor *mean,
                              fr_tensor *invstd);

/* During a checkpointed segment's first forward: keeps a copy of mean and
 * invstd (C floats each, host memory of the node's: 8 bytes a channel,
 * about 90 KB a DenseNet-BC-100 step) for the replay. Elsewhere or on a
 * GPU, a no-op; out of memory, the replay computes every norm's again. */
void fr_checkpoint_stats_keep(const fr_tensor *gamma, const fr_tensor *x, const fr_tensor *mean,
                              const fr_tensor *invstd);

/* How many statistics replays on this thread have taken so far (tests). */
long fr_checkpoint_stats_taken(void);

#ifdef __cplusplus
}
#endif

#endif
