//===- Ckpt.h - pcc's checkpoint subcommands --------------------*- C++ -*-===//

#ifndef PCC_TOOLS_PCC_CKPT_H
#define PCC_TOOLS_PCC_CKPT_H

/// `pcc export CKPT -o trained.onnx [--model model.onnx]` (Export.cpp).
int exportCheckpoint(int argc, char **argv);
/// `pcc ckpt inspect|verify|export ...` (Ckpt.cpp).
int runCkpt(int argc, char **argv);

#endif // PCC_TOOLS_PCC_CKPT_H
