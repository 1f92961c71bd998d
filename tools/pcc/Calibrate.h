//===- Calibrate.h - pcc calibrate ------------------------------*- C++ -*-===//

#ifndef PCC_TOOLS_PCC_CALIBRATE_H
#define PCC_TOOLS_PCC_CALIBRATE_H

/// `pcc calibrate -o machine.json [-n RANKS] [--device cpu|cuda] [--base
/// NAME] [--quick] [--hostfile FILE]` (Calibrate.cpp).
int runCalibrate(int argc, char **argv);

#endif // PCC_TOOLS_PCC_CALIBRATE_H
