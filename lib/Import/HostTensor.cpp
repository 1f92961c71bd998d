//===- HostTensor.cpp - constant tensors evaluated at import time ---------===//

#include "HostTensor.h"

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include "llvm/ADT/APFloat.h"
#include <cmath>

using namespace llvm;

namespace mlir::pcc::onnx_import {

HostTensor::HostTensor(Type elementType, ArrayRef<int64_t> shape)
    : elementType(elementType), shape(shape), count(numElements(shape)) {
  if (isFloat())
    floatData.assign(count, 0.0);
  else
    intData.assign(count, 0);
}

HostTensor HostTensor::ints(Type elementType, ArrayRef<int64_t> shape,
                            ArrayRef<int64_t> values) {
  HostTensor t(elementType, shape);
  for (int64_t i = 0; i < t.count; ++i)
    t.setInt(i, values[i]);
  return t;
}

HostTensor HostTensor::floats(Type elementType, ArrayRef<int64_t> shape,
                              ArrayRef<double> values) {
  HostTensor t(elementType, shape);
  for (int64_t i = 0; i < t.count; ++i)
    t.setDouble(i, values[i]);
  return t;
}

HostTensor HostTensor::fromAttr(ElementsAttr attr) {
  auto type = cast<ShapedType>(attr.getType());
  HostTensor t(type.getElementType(), type.getShape());
  int64_t i = 0;
  if (t.isFloat()) {
    for (APFloat v : attr.getValues<APFloat>())
      t.floatData[i++] = v.convertToDouble();
  } else {
    bool isUnsigned = type.getElementType().isUnsignedInteger() ||
                      type.getElementType().isInteger(1);
    for (APInt v : attr.getValues<APInt>())
      t.intData[i++] = isUnsigned ? static_cast<int64_t>(v.getZExtValue())
                                  : v.getSExtValue();
  }
  return t;
}

int64_t HostTensor::getInt(int64_t i) const {
  return isFloat() ? static_cast<int64_t>(floatData[i]) : intData[i];
}

double HostTensor::getDouble(int64_t i) const {
  return isFloat() ? floatData[i] : static_cast<double>(intData[i]);
}

void HostTensor::setInt(int64_t i, int64_t v) {
  if (isFloat())
    floatData[i] = static_cast<double>(v);
  else
    intData[i] = elementType.isInteger(1) ? (v != 0) : v;
}

void HostTensor::setDouble(int64_t i, double v) {
  if (isFloat()) {
    floatData[i] = v;
  } else if (elementType.isInteger(1)) {
    intData[i] = v != 0.0;
  } else {
    // Out-of-range and NaN conversions are undefined in ONNX; saturate
    // instead of invoking undefined behaviour in C++.
    if (std::isnan(v))
      intData[i] = 0;
    else if (v >= 9.2e18)
      intData[i] = INT64_MAX;
    else if (v <= -9.2e18)
      intData[i] = INT64_MIN;
    else
      intData[i] = static_cast<int64_t>(v);
  }
}

std::vector<int64_t> HostTensor::toInts() const {
  std::vector<int64_t> out(count);
  for (int64_t i = 0; i < count; ++i)
    out[i] = getInt(i);
  return out;
}

RankedTensorType HostTensor::getType() const {
  return RankedTensorType::get(shape, elementType);
}

DenseElementsAttr HostTensor::toAttr() const {
  RankedTensorType type = getType();
  if (auto floatType = dyn_cast<FloatType>(elementType)) {
    SmallVector<APFloat> values;
    values.reserve(count);
    for (double v : floatData) {
      APFloat f(v);
      bool lost;
      f.convert(floatType.getFloatSemantics(), APFloat::rmNearestTiesToEven,
                &lost);
      values.push_back(f);
    }
    return DenseElementsAttr::get(type, values);
  }
  unsigned width = elementType.getIntOrFloatBitWidth();
  SmallVector<APInt> values;
  values.reserve(count);
  for (int64_t v : intData)
    values.push_back(APInt(width, static_cast<uint64_t>(v),
                           /*isSigned=*/!elementType.isUnsignedInteger(),
                           /*implicitTrunc=*/true));
  return DenseElementsAttr::get(type, values);
}

HostTensor HostTensor::reshaped(ArrayRef<int64_t> newShape) const {
  HostTensor t = *this;
  t.shape.assign(newShape.begin(), newShape.end());
  return t;
}

HostTensor HostTensor::castTo(Type newType) const {
  HostTensor t(newType, shape);
  for (int64_t i = 0; i < count; ++i) {
    if (isFloat())
      t.setDouble(i, floatData[i]);
    else
      t.setInt(i, intData[i]);
  }
  return t;
}

SmallVector<int64_t> stridesOf(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

HostTensor broadcastTo(const HostTensor &t, ArrayRef<int64_t> shape) {
  HostTensor out(t.getElementType(), shape);
  SmallVector<int64_t> outStrides = stridesOf(shape);
  SmallVector<int64_t> inStrides = stridesOf(t.getShape());
  int64_t offset = shape.size() - t.getRank();
  for (int64_t i = 0; i < out.size(); ++i) {
    int64_t rem = i, src = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t idx = rem / outStrides[d];
      rem %= outStrides[d];
      int64_t id = static_cast<int64_t>(d) - offset;
      if (id >= 0 && t.getShape()[id] != 1)
        src += idx * inStrides[id];
    }
    if (t.isFloat())
      out.setDouble(i, t.getDouble(src));
    else
      out.setInt(i, t.getInt(src));
  }
  return out;
}

} // namespace mlir::pcc::onnx_import
