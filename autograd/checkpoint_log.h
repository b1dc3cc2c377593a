/* checkpoint_log.h: what a checkpointed segment's forward hands to its
 * replay in backward (autograd/fn_checkpoint.c): each batch norm's
 * statistics and, under compress:B, each ReLU's mask.
 *
 * Statistics. A replay runs the segment again on the same input bytes, so
 * each batch norm in it would compute the statistics its first forward
 * computed, bit for bit (the same kernel on the same values). The
 * checkpoint node keeps each one's (mean, invstd), C floats each, in the
 * order the forward made them; the replay takes them back instead of
 * summing every activation again. Not taken (computed again, as before)
 * when the segment's input was kept as compressed codes (the replay's input
 * is their decoding, not the forward's bytes), for a norm the segment runs
 * more than once, and after an entry was lost to a failed allocation.
 *
 * Masks. When the segment's input is kept as compressed codes, the replay
 * runs on their decoding, and a ReLU mask rebuilt there flips wherever the
 * forward's value lay near zero: each flip passes or blocks a whole
 * gradient value (ResNet-20 checkpoint:1+compress:8, one step: 0.21
 * relative gradient error against plain; compress:8 alone 0.007). So the
 * forward keeps every sign-only activation's mask as bits (1/32 of its
 * output, under the ledger's `saved` tag) in the order it ran them, and
 * the replay's activations save those instead of their own. Internal: the
 * activations (fn_activation.c), the fused BN + activation (fn_bn_act.c)
 * and the fused group norm + activation (fn_norm.c) call these. */
#ifndef FR_CHECKPOINT_LOG_H
#define FR_CHECKPOINT_LOG_H

#include "node.h"

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

/* The one call of every op whose backward reads only its output's sign
 * (ReLU, leaky ReLU, the fused BN + ReLU, the fused group norm + ReLU
 * under compress:B), made once per forward after y
 * is computed, whether or not it records a node (node NULL: none), so that
 * a replay meets its masks in its forward's order. Saves y's sign for
 * node's backward as fr_node_save_sign does, except in a replay that has
 * its forward's masks, where it saves the forward's mask of this op; in a
 * checkpointed forward that keeps masks, it keeps y's. Returns the saved
 * entry's index (0 without a node), or -1 with the error set (out of
 * memory). A replay whose op does not match its forward's (another shape or
 * layout) saves its own masks from there on, as without the log. The
 * replay runs under its forward's compress:B (fn_checkpoint.c), so the
 * ops that keep a mask only under compression meet theirs; under
 * retain_graph a replay shares each mask with its node, so that a second
 * backward takes it again. */
int fr_node_keep_sign(fr_node *node, fr_tensor *y);

/* What the segment reads. The replay reads every parameter, buffer and
 * constant the forward read, so the checkpoint node keeps each one's
 * storage version, as a plain node does for what it saves, and its
 * backward refuses with FR_ERR_VERSION (naming the tensor and its last
 * writer) when one was written inplace since. fr_should_record reports
 * each op's inputs under no_grad; in a checkpointed segment's forward those
 * it did not make (its birth mark, tensor.h) and that belong to no graph
 * are noted, its own input excepted (the node saves it). A norm that reads
 * its running statistics (eval mode) reports them too; in training mode it
 * writes them, once, and the replay (recompute mode) neither reads nor
 * writes them. */
void fr_checkpoint_note_reads(int n, fr_tensor *const *inputs);

/* Every op that records a node checks each input (fr_node_new): one made
 * inside a checkpointed segment's no-grad forward, other than that
 * segment's output (the node rebinds it and clears its mark), has no
 * graph, and a gradient into it would be lost. FR_ERR_GRAPH naming op and
 * input i; FR_OK for any other tensor or NULL. */
fr_status fr_checkpoint_check_input(const char *op, int i, const fr_tensor *t);

/* This thread's logs set aside and put back, around a trial that measures
 * steps of a model (nn/segments.c's split, planner/profile.c): such a
 * trial may run inside a user's checkpointed forward or replay (a model's
 * split is made on its first recorded forward, which inside a user's
 * checkpoint is the replay), and its ops must neither take the replay's
 * masks and statistics, which its own ops then miss (they rebuilt the
 * masks from the decoded input: other gradients), nor add entries to the
 * forward's log. */
typedef struct {
    void *recording, *replaying, *watching;
    uint64_t mark;
} fr_checkpoint_logs;
fr_checkpoint_logs fr_checkpoint_logs_suspend(void);
void fr_checkpoint_logs_resume(fr_checkpoint_logs logs);

/* How many statistics replays on this thread have taken so far, and how
 * many masks (tests). */
long fr_checkpoint_stats_taken(void);
long fr_checkpoint_masks_taken(void);

#ifdef __cplusplus
}
#endif

#endif
