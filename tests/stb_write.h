/* stb_write.h: stb_image_write compiled into the including test program
 * (static, so two programs never clash), with the warnings its code gives
 * under -Wextra silenced. Tests and seed generators write their images
 * with it. */
#ifndef FR_TESTS_STB_WRITE_H
#define FR_TESTS_STB_WRITE_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#endif
