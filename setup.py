from setuptools import find_packages, setup

setup(
    name="qknorm-fairseq",
    version="0.1.0",
    description="Normalization-centric Transformers (PreNorm, ScaleNorm, FixNorm, QKNorm, "
    "Lp-QKNorm, DNAS/HNAS) as a fairseq user-dir plugin for low-resource NMT",
    packages=find_packages(include=["qknorm_fairseq", "qknorm_fairseq.*", "qknorm_pipeline", "qknorm_pipeline.*"]),
    python_requires=">=3.11",
    # Installed by scripts/install.sh in a deliberate order (see the comments there);
    # listed here for information and for pip check.
    install_requires=["fairseq-fixed==0.12.3.1", "torch>=2.1", "sacrebleu>=2.3"],
)
