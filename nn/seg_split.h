/* seg_split.h: choosing checkpoint segments by bytes, not by block count.
 *
 * Checkpointing keeps each segment's input through the whole step and, while
 * backward replays a segment, that segment's own saved activations. Equal
 * block counts are a poor split for CIFAR networks, whose first stage has
 * activations 4x larger than the last: the replay of a first-stage segment
 * sets the peak. fr_seg_split follows Chen et al. 2016 (section 4.2):
 * split greedily under a byte budget b, starting a new segment when the next
 * block would pass b, and search b for the split whose estimated peak is
 * smallest. Because every segment input stays held until backward reaches
 * it, later segments should be shorter than a constant budget makes them, so
 * the splitter also bisects on the peak with a split that counts the inputs
 * already held, and keeps the best. The objective is the total peak, not
 * the saved bytes alone: a segment's input held through the step, the
 * tensors its steps keep and the gradients in flight, so that a cut which
 * holds more than it frees is not taken and the uncut sequence (plain's
 * peak) is always a candidate.
 *
 * The costs are measured, not estimated: nn/segments.c runs each block once
 * (a trial forward under the strategy and precision of the step) and reads
 * the growth of the ledger's saved tag, so the splitter sees what the block
 * really keeps, whatever model it belongs to. Under mixed precision those
 * bytes are half size; the split itself does not change when every cost
 * scales alike (the splitter compares sums of costs, and a factor of 2 or
 * 1/2 is exact in floating point); the peak it estimates does. */
#ifndef FR_SEG_SPLIT_H
#define FR_SEG_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one activation element in the forward being planned: the size of
 * the autocast dtype (autograd.h) when called inside fr_model_forward, so 2
 * under f16 or bf16 and 4 under f32 or outside autocast (for estimates
 * made before anything runs). */
size_t fr_seg_elem_bytes(void);

/* What the splitter knows of a sequence of n steps, measured:
 *  cost[i]: bytes step i keeps for backward, its input excluded;
 *  input[i]: bytes of step i's input (held by a checkpoint when a segment
 *            starts at i; also the size of the gradient flowing there);
 *  input_kept[i]: bytes of its input that step i itself keeps (a conv or a
 *            norm layer keeps what it reads; 0 for most blocks, whose first
 *            op's input is the block's); NULL: none;
 *  backward[i]: the most bytes step i's backward allocates above what it
 *            holds when it starts (its input's gradient, a norm output it
 *            recomputes, workspaces), measured by running it once; NULL:
 *            the input's gradient only;
 *  held[i]: bytes a checkpoint holds when a segment starts at i: under
 *            compress:B the input's B-bit codes (what the ledger's saved tag
 *            gets, fr_compress_nbytes), not its full width. NULL: input[i],
 *            at full width, where the replay's leaf is the held tensor
 *            itself. When given, a replayed segment also counts, while its
 *            steps run backward, the full-width tensors beside the codes:
 *            its decoded input (the replay's leaf), its replayed output and
 *            the output's gradient in flight;
 *  input_shared[i]: bytes of step i's input codes that cost[i] counts but
 *            that step i-1 made already (an op of its own saved its output
 *            compressed): inside a segment step i shares them, so they
 *            leave cost[i]; at a segment's start the replay's input is a
 *            fresh tensor that step i packs again. NULL: none;
 *  masks[i]: bytes of the ReLU masks (bits) step i keeps for backward,
 *            cost[i] counts them: a checkpoint whose input is kept as
 *            codes keeps them from its forward to its replay as well
 *            (autograd/checkpoint_log.h), which then saves them rather
 *            than its own. NULL: none;
 *  last_as_is: the last segment runs without a checkpoint (the root chain,
 *            nn/segments.c): its input is held by its first step, not by a
 *            checkpoint, and it is not replayed. */
typedef struct {
    const double *cost, *input, *input_kept, *backward, *held, *input_shared, *masks;
    int n;
    bool last_as_is;
} fr_seg_costs;

/* Writes the length of each segment into seg_len (room for n) and returns
 * the number of segments (0 when n <= 0): the split whose fr_seg_peak is
 * smallest among one segment (the sequence uncut, which the root chain runs
 * as it is), every split when n <= 14, and otherwise equal runs, Chen's
 * budget splits and the prefix-aware split. Ties go to fewer segments.
 * Deterministic. */
int fr_seg_split(const fr_seg_costs *c, int *seg_len);

/* The estimated peak of a split (the quantity minimised): the largest, over
 * segments s and steps j of s, of the inputs of segments 0..s, what steps
 * first(s)..j keep, and the gradients of step j's input and output (the
 * total peak's shape while backward runs step j, not saved bytes alone: a
 * cut that saves less than the input it holds raises the peak). */
double fr_seg_peak(const fr_seg_costs *c, const int *seg_len, int n_seg);

/* The estimated peak of the saved bytes alone under a split (what the
 * ledger's saved tag reaches): fr_seg_peak's terms without the gradients
 * and full-width tensors in flight. */
double fr_seg_saved(const fr_seg_costs *c, const int *seg_len, int n_seg);

/* The estimated saved bytes when the forward ends: every checkpoint's input
 * as it holds it (held[]) and what a last segment run as it is keeps. The
 * ledger's saved tag after a forward under the split, exactly, when the
 * costs were measured on that input. */
double fr_seg_forward_saved(const fr_seg_costs *c, const int *seg_len, int n_seg);

#ifdef __cplusplus
}
#endif
#endif
