"""The project's tests, laid out as the source is.

    engine/<package>/   tests of engine/llama, costs, library, decoding, speed, server, tools
    engine/             tests of engine's own modules (documents) and of the engine offline
    app/                tests of app/; app/widgets/ and app/store/ mirror app/widgets/ and app/store/
    packaging/          the llama.cpp build in use, its batch kernels, the bundle
    project/            the project as a whole: import layers, Qt kept out of the engine, one home per fact
    helpers/            code the tests share (fixtures, model files, curves), imported as tests.helpers.*
    data/               files the tests read (what-if cost curves)
"""
