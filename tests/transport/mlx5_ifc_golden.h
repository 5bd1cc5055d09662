/* The Linux kernel's mlx5 command layouts (include/linux/mlx5/mlx5_ifc.h), read by
 * mlx5_ifc_golden.c, a C translation unit: the kernel header is C (flexible array
 * members inside structs) and cannot be included from C++. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A field of a kernel layout struct: its path below the struct (mlx5_ifc_<struct>_bits)
 * and its bit offset and width, by offsetof and sizeof (one byte per bit there). */
struct railyard_ifc_field {
  const char* path;
  size_t bit;
  size_t width;
};
extern const struct railyard_ifc_field railyard_ifc_fields[];
extern const size_t railyard_ifc_field_count;

struct railyard_ifc_constant {
  const char* name;
  uint32_t value;
};
extern const struct railyard_ifc_constant railyard_ifc_constants[];
extern const size_t railyard_ifc_constant_count;

#ifdef __cplusplus
}
#endif
