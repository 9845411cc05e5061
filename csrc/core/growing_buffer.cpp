#include "core/growing_buffer.h"

#include "ember/errors.h"

namespace ember {

void* GrowingBuffer::get(size_t bytes) {
  if (bytes > capacity_) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    buffer_.reset();  // the old block freed first: never both at once
    capacity_ = 0;
    buffer_.reset(std::aligned_alloc(4096, rounded));
    EMBER_CHECK(buffer_ != nullptr, RuntimeError, "ember: could not allocate a working buffer of ", rounded, " bytes");
    capacity_ = rounded;
  }
  return buffer_.get();
}

}  // namespace ember
