/* unet.c: a small U-Net denoising autoencoder on Fashion-MNIST (bilinear
 * upsampling, skip concatenation, GroupNorm + SiLU; built in unet_model.h,
 * shared with its test): noisy image in, clean image out, MSE through the
 * model's loss callback, trained by the library's own loop so every flag of
 * `train` applies:
 *
 *     build/examples/unet --data fashion-mnist --epochs 1 \
 *         --limit-train 2048 --limit-test 512 --batch 32 --optimizer adam
 *
 * The "test loss" the loop prints is the denoised image's MSE against the
 * clean one; at the end the example prints it next to the noisy input's MSE
 * on the same test images, so a reader sees whether it denoises. */
#include "unet_model.h"

int main(int argc, char **argv) {
    fr_status st = fr_model_register("unet", false, unet_create,
                                     "unet (denoising U-Net: GroupNorm + SiLU, bilinear upsampling)");
    if (st != FR_OK) {
        fprintf(stderr, "unet: %s\n", fr_last_error());
        return 1;
    }
    int rc = fr_train_main_model(argc, argv, "unet");
    if (rc == 0 && unet_eval_noise_n > 0)
        printf("denoising: the noisy input's MSE against the clean test images is %.4f "
               "(noise sigma %.2f, normalised units); the test loss above is the U-Net's\n",
               unet_eval_noise_sq / (double)unet_eval_noise_n, (double)UNET_NOISE_SIGMA);
    return rc;
}
