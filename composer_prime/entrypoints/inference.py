from composer_prime.inference.serve import main

__all__ = ["main"]


if __name__ == "__main__":
    main()
