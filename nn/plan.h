/* plan.h: choosing checkpoint segments by bytes, not by block count.
 *
 * Checkpointing keeps each segment's input through the whole step and, while
 * backward replays a segment, that segment's own saved activations. Equal
 * block counts are a poor split for CIFAR networks, whose first stage has
 * activations 4x larger than the last: the replay of a first-stage segment
 * sets the peak. fr_plan_segments follows Chen et al. 2016 (section 4.2):
 * split greedily under a byte budget b, starting a new segment when the next
 * block would pass b, and search b for the split whose estimated peak is
 * smallest. Because every segment input stays held until backward reaches
 * it, later segments should be shorter than a constant budget makes them, so
 * the planner also bisects on the peak with a split that counts the inputs
 * already held, and keeps the better of the two.
 *
 * The costs are measured, not estimated: nn/segments.c runs each block once
 * (a trial forward under the strategy and precision of the step) and reads
 * the growth of the ledger's saved tag, so the planner sees what the block
 * really keeps, whatever model it belongs to. Under mixed precision those
 * bytes are half size; the split itself does not change when every cost
 * scales alike (the planner compares sums of costs, and a factor of 2 or
 * 1/2 is exact in floating point); the peak it estimates does. */
#ifndef FR_PLAN_H
#define FR_PLAN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one activation element in the forward being planned: the size of
 * the autocast dtype (autograd.h) when called inside fr_model_forward, so 2
 * under f16 or bf16 and 4 under f32 or outside autocast (for estimates
 * made before anything runs). */
size_t fr_plan_elem_bytes(void);

/* block_cost[i]: bytes block i keeps for backward (excluding its input);
 * input_cost[i]: bytes of block i's input, kept when a segment starts at i.
 * Writes the length of each segment into seg_len (room for n) and returns
 * the number of segments (0 when n <= 0). Deterministic. */
int fr_plan_segments(const double *block_cost, const double *input_cost, int n, int *seg_len);

/* The estimated peak of saved bytes for a split (the quantity minimised):
 * max over segments s of (inputs of segments 0..s) + cost of s. */
double fr_plan_peak(const double *block_cost, const double *input_cost, int n, const int *seg_len,
                    int n_seg);

#ifdef __cplusplus
}
#endif
#endif
