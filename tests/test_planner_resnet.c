/* test_planner_resnet.c: the planner's budget sweep (planner_budgets.h)
 * on a ResNet: resnet56 batch 16 in the plain build,
 * resnet20 batch 4 under ASan/UBSan, resnet56 batch 64 (the issue's size) with
 * FR_PLANNER_ISSUE_SIZES=1. */
#include "planner_budgets.h"

static void test_resnet_budgets(void) {
    if (issue_sizes())
        check_model_budgets("resnet56", 64);
    else if (FR_T_SANITIZED)
        check_model_budgets("resnet20", 4);
    else
        check_model_budgets("resnet56", 16);
}

int main(void) {
    RUN(test_resnet_budgets);
    return TEST_SUMMARY();
}
