/* validate: evaluates saved weights on a test set, under no_grad, and
 * compares the memory of that pass with one training step; see
 * programs/program_validate.c for the flags. Its whole logic is the library call
 * fr_validate_main (programs/programs.h), so a program that registers its own
 * model validates it the same way. */
#include <frugal/frugal.h>

int main(int argc, char **argv) { return fr_validate_main(argc, argv); }
