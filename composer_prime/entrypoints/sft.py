from composer_prime.trainer.sft import main

__all__ = ["main"]


if __name__ == "__main__":
    main()
