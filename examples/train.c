/* train: trains a model on an image dataset and reports accuracy, speed
 * and memory as it goes; programs/program_train.c has the flags. Its whole logic
 * is the library call fr_train_main (programs/programs.h), so a program that
 * registers its own model trains it the same way. */
#include <frugal/frugal.h>

int main(int argc, char **argv) { return fr_train_main(argc, argv); }
