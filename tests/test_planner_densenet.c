/* test_planner_densenet.c: the planner's budget sweep (planner_budgets.h)
 * on a DenseNet: densenet-bc-100 batch 4 in the plain build,
 * densenet-bc-40 batch 2 under ASan/UBSan, densenet-bc-100 batch 32 (the issue's size) with
 * FR_PLANNER_ISSUE_SIZES=1. */
#include "planner_budgets.h"

static void test_densenet_budgets(void) {
    if (issue_sizes())
        check_model_budgets("densenet-bc-100", 32);
    else if (FR_T_SANITIZED)
        check_model_budgets("densenet-bc-40", 2);
    else
        check_model_budgets("densenet-bc-100", 4);
}

int main(void) {
    RUN(test_densenet_budgets);
    return TEST_SUMMARY();
}
