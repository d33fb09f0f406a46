"""Entry point: ``python run.py system=lbs model=opt-6.7b beams=64`` (one job) or
``python run.py -m experiment=lbs_fig9`` (a paper figure's sweep). See README.md."""
import sys

import hydra
from omegaconf import DictConfig

from harness.config import ConfigError, register_configs, register_resolvers

register_resolvers()
register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from harness.run import run
    try:
        run(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
