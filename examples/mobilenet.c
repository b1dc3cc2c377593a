/* mobilenet.c: a MobileNetV2-style CIFAR network (depthwise 3x3,
 * squeeze-excitation, hardswish / SiLU; built in mobilenet_model.h, shared
 * with its test) trained by the library's own loop, so every flag of `train`
 * applies:
 *
 *     build/examples/mobilenet --data fashion-mnist \
 *         --epochs 1 --limit-train 2048 --limit-test 512 --strategy recompute
 */
#include "mobilenet_model.h"

int main(int argc, char **argv) {
    fr_status st = fr_model_register("mobilenet_se", false, mobilenet_create,
                                     "mobilenet_se (MobileNetV2-style, squeeze-excitation, depthwise 3x3)");
    if (st != FR_OK) {
        fprintf(stderr, "mobilenet: %s\n", fr_last_error());
        return 1;
    }
    return fr_train_main_model(argc, argv, "mobilenet_se");
}
