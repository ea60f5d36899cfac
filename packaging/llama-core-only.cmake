# Included right after llama.cpp's project() call (CMAKE_PROJECT_llama.cpp_INCLUDE, set by
# packaging/llama_source.py --cmake-args for every build path).
#
# llama-cpp-python forces llama.cpp's "common" library on (LLAMA_BUILD_COMMON ... FORCE): the argument
# parser, chat templates and sampling helpers of llama.cpp's own tools, a quarter of the build's objects.
# The Python bindings never load it, and neither does the app, so it is switched off again here, before
# llama.cpp's CMakeLists reads the option. The multimodal library (mtmd) is left out by -DLLAVA_BUILD=OFF.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
