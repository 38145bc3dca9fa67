"""The draft weights each published table was measured with, as ``runner.weights_fingerprint`` records them
(file name + sha256[:16]; for a draft replaced since: ``git show <commit>:models/<dir>/<file> | sha256sum``).
Tests that rebuild a published row's config hash pin these instead of the committed draft, which moves on."""

TOKEN_STEP231 = ["head.safetensors:008dc9ee7a64ffa1", "model.safetensors:27e1064226ac9b72"]  # git 2d2cdd4
FEATURE_RUN1 = ["head.safetensors:2d67500dcc3686e8", "model.safetensors:daf26ba3653dd2fc"]  # git f59ce6a
FEATURE_RUN2 = ["head.safetensors:3121bc266fd46e0d", "model.safetensors:3cde898f6970aaf9"]  # git 4ccb915
FEATURE_RUN3 = ["head.safetensors:09016dde359a3550", "model.safetensors:73e87e72ff4a11cc"]  # git a69d499
FEATURE_RUN5 = ["head.safetensors:9a24f807d4e804f8", "model.safetensors:2f27c7f2bd8d1526"]  # git 893d0d7
# published file stem -> the draft its rows ran with
DRAFT = {"cpu_table-2026-12-03": TOKEN_STEP231,
         "cpu_table_feature-2026-12-03": FEATURE_RUN1, "cpu_table_bf16_feature-run2-2026-12-04": FEATURE_RUN2,
         "cpu_table_bf16_feature-2026-12-04": FEATURE_RUN3, "cpu_table_feature-2026-12-04": FEATURE_RUN3,
         "cpu_table_bf16_feature-2026-12-05": FEATURE_RUN3, "cpu_table_bf16_feature-2026-12-06": FEATURE_RUN5,
         "cpu_qa-2026-12-06": FEATURE_RUN5,
         "cpu_qa_rescored-2026-12-07": FEATURE_RUN5, "cpu_table_bf16_feature-interleaved-2026-12-06": FEATURE_RUN5}
