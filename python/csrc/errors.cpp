// Maps the core's typed exceptions (and oneDNN's) to Python exceptions. Order matters: ember's TypeError derives
// from std::invalid_argument, which pybind11 would otherwise turn into ValueError.
#include "errors.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <string>

#include "ember/errors.h"

namespace ember::binding {

void register_exception_translators() {
  // NOLINTNEXTLINE(performance-unnecessary-value-param): pybind11 takes a void(*)(std::exception_ptr)
  pybind11::register_exception_translator([](std::exception_ptr error) {
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const ember::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ember::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const ember::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const ember::RuntimeError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const dnnl::error& e) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("oneDNN error (status ") +
                                           std::to_string(static_cast<int>(e.status)) + "): " + e.what())
                                              .c_str());
    }
  });
}

}  // namespace ember::binding
